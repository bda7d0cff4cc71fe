// gpupool in JupyterLab 4 and Notebook 7: the GPU share and the time left where the user already
// looks (the status bar; Notebook 7 has none, so its top bar), and a notification with an Extend
// button before the idle culler stops the server. Data comes from this server's own endpoint
// (gpupool/widgets/labserver.py), which asks the gpupool API with the server's hub token.

import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { budgetWarning, itemText, itemTitle, moved, warning } from './text.js';

const PLUGIN = 'gpupool-lab:plugin';

async function call(method, path) {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpupool', path);
  const response = await ServerConnection.makeRequest(url, { method }, settings);
  let body = {};
  try {
    body = await response.json();
  } catch (err) {
    body = { error: `HTTP ${response.status}` };
  }
  if (!response.ok && !body.error) {
    body.error = body.message || `HTTP ${response.status}`;
  }
  return body;
}

class GPUStatusItem extends Widget {
  constructor() {
    super();
    this.addClass('gpupool-StatusItem');
    this.node.style.padding = '0 6px';
    this.node.style.whiteSpace = 'nowrap';
    this.update(null);
  }

  update(status) {
    this.node.textContent = itemText(status);
    this.node.title = itemTitle(status);
    this.node.dataset.action = (status && status.action) || '';
    this.node.style.color = status && status.action === 'warn' ? 'var(--jp-warn-color0)' : '';
  }
}

const plugin = {
  id: PLUGIN,
  description: 'The GPU share and time left of this server; a warning with Extend before a cull.',
  autoStart: true,
  optional: [IStatusBar, ISettingRegistry],
  activate: (app, statusBar, settingRegistry) => {
    const item = new GPUStatusItem();
    if (statusBar) {
      statusBar.registerStatusItem(PLUGIN, { item, align: 'left', rank: 3 });
    } else {
      item.id = 'gpupool-status';  // Notebook 7: no status bar; the top bar is where users look
      app.shell.add(item, 'top', { rank: 900 });
    }
    const options = { warnMinutes: 15, pollSeconds: 20 };
    let shown = '';  // the warning already on screen: one notification per warning
    let movedShown = '';  // the last move told: one notification per move
    let budgetShown = '';  // the GPU-hour budget's notification: one per state (near, over)
    let timer = 0;
    let last = null;  // the last status read without an error

    const extend = async () => {
      const result = await call('POST', 'extend');
      if (result.error) {
        Notification.error(`Could not extend: ${result.error}`, { autoClose: 8000 });
      } else {
        Notification.success('Extended: the idle culler gives this session more time once.',
                             { autoClose: 5000 });
      }
      await poll();
    };
    const resume = async () => {
      const result = await call('POST', 'resume');
      if (result.error) {
        Notification.error(`Could not resume: ${result.error}`, { autoClose: 8000 });
      }
      await poll();
    };

    const poll = async () => {
      let status;
      try {
        status = await call('GET', 'status');
      } catch (err) {
        status = { error: String(err) };
      }
      if (status.error && last) {
        // one failed read (a busy hub) keeps what was last known, and says so in the tooltip
        status = { ...last, stale: status.error };
      } else if (!status.error) {
        last = status;
      }
      item.update(status);
      const move = moved(status);
      if (move && move.key !== movedShown) {
        movedShown = move.key;
        Notification.info(move.message, { autoClose: 10000 });
      }
      const warn = warning(status, options.warnMinutes);
      if (warn && warn.key !== shown) {
        shown = warn.key;
        const actions = warn.extendable
          ? [{ label: 'Extend', caption: 'More time for this session (once)', callback: extend,
               displayType: 'accent' }]
          : [];
        Notification.warning(warn.message, { autoClose: false, actions });
      } else if (status && status.parked && shown !== 'parked') {
        shown = 'parked';  // GPU parking: the share is parked until the user resumes it
        Notification.info(`This server's GPU is parked: ${status.parked}`, {
          autoClose: false,
          actions: [{ label: 'Resume', callback: resume, displayType: 'accent' }]
        });
      } else if (!warn && !(status && status.parked)) {
        shown = '';
      }
      const budget = budgetWarning(status);  // gpupool.usage: near or over the GPU-hour budget
      if (budget && budget.key !== budgetShown) {
        budgetShown = budget.key;
        Notification.warning(budget.message, { autoClose: false });
      } else if (!budget && !(status && status.error)) {
        budgetShown = '';
      }
    };

    const schedule = () => {
      window.clearInterval(timer);
      timer = window.setInterval(poll, options.pollSeconds * 1000);
    };
    if (settingRegistry) {
      settingRegistry.load(PLUGIN).then(settings => {
        const read = () => {
          options.warnMinutes = settings.get('warnMinutesBefore').composite;
          options.pollSeconds = settings.get('pollSeconds').composite;
          schedule();
          void poll();
        };
        settings.changed.connect(read);
        read();
      }).catch(() => schedule());
    } else {
      schedule();
    }
    void app.restored.then(poll);
  }
};

export default plugin;
