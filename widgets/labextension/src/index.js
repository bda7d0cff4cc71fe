// gpupool in JupyterLab 4 and Notebook 7: the GPU share and the time left where the user already
// looks (the status bar; Notebook 7 has none, so its top bar), and one notification with an Extend
// button before the idle culler stops the server, kept up to date and closed once it no longer
// applies. Data comes from this server's own endpoint (gpupool/widgets/labserver.py), which asks
// the gpupool API with the server's hub token; it is read only while the page is visible, and
// reading it is no user activity.

import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { call, whileVisible } from './api.js';
import { followLogs } from './follow.js';
import { COMMAND, addHibernateCommand } from './hibernate.js';
import { itemText, itemTitle, moved, noticeChange, notices } from './text.js';

const PLUGIN = 'gpupool-lab:plugin';

class GPUStatusItem extends Widget {
  constructor() {
    super();
    // built as JupyterLab's own status items are (a GroupItem holding a TextItem), so it takes
    // their font and line height and is centred in the bar: bare text in the item sat higher
    // than its neighbours
    this.addClass('gpupool-StatusItem');
    this.addClass('jp-StatusBar-GroupItem');
    this.node.style.padding = '0 6px';
    this.node.style.whiteSpace = 'nowrap';
    this.text = document.createElement('span');
    this.text.className = 'jp-StatusBar-TextItem';
    this.node.appendChild(this.text);
    this.setStatus(null);
  }

  // not update() or show(): lumino calls those (no argument) when the status bar lays itself out,
  // and the item then said "GPU ?" until the next read, up to a poll interval later
  setStatus(status) {
    this.text.textContent = itemText(status);
    // "Hibernate now" only where the hub lets this user hibernate (the culler's rules for their group)
    this.hibernates = Boolean(status && status.hibernate === true);
    this.node.title = itemTitle(status) + (this.hibernates ? '\nClick to hibernate this server now' : '');
    this.node.style.cursor = this.hibernates ? 'pointer' : '';
    this.node.dataset.action = (status && status.action) || '';
    this.text.style.color = status && status.action === 'warn' ? 'var(--jp-warn-color0)' : '';
  }
}

const plugin = {
  id: PLUGIN,
  description: 'The GPU share and time left of this server; a warning with Extend before a cull.',
  autoStart: true,
  optional: [IStatusBar, ISettingRegistry, ICommandPalette],
  activate: (app, statusBar, settingRegistry, palette) => {
    followLogs(document.body);  // job monitors' log boxes show their last lines
    const item = new GPUStatusItem();
    addHibernateCommand(app, palette, () => item.hibernates);
    // a click on the item offers "Hibernate now" (also in the command palette), where it is on
    item.node.addEventListener('click', () => {
      if (item.hibernates) {
        void app.commands.execute(COMMAND);
      }
    });
    if (statusBar) {
      statusBar.registerStatusItem(PLUGIN, { item, align: 'left', rank: 3 });
    } else {
      item.id = 'gpupool-status';  // Notebook 7: no status bar; the top bar is where users look
      app.shell.add(item, 'top', { rank: 900 });
    }
    const options = { warnMinutes: 15, pollSeconds: 20 };
    // the notifications on screen, one per slot (the culler's warning, the parked GPU, the
    // GPU-hour budget, a process killed over the memory limit): {id, kind, key, message,
    // extendable} or null
    const shown = { warning: null, info: null, budget: null, memory: null };
    let movedShown = '';  // the last move told: one notification per move (it closes by itself)
    let last = null;  // the last status read without an error
    let reader = null;

    const extend = async () => {
      const result = await call('POST', 'extend');
      if (result.error) {
        Notification.error(`Could not extend: ${result.error}`, { autoClose: 8000 });
      } else {
        Notification.success('Extended: the idle culler gives this session more time once.',
                             { autoClose: 5000 });
      }
      await reader.now();
    };
    const resume = async () => {
      const result = await call('POST', 'resume');
      if (result.error) {
        Notification.error(`Could not resume: ${result.error}`, { autoClose: 8000 });
      }
      await reader.now();
    };
    const actionsFor = next => next.kind === 'warning'
      ? (next.extendable ? [{ label: 'Extend', caption: 'More time for this session (once)', callback: extend,
                             displayType: 'accent' }] : [])
      : next.key === 'parked'
        ? [{ label: 'Resume', caption: 'Ask for the GPU back now', callback: resume, displayType: 'accent' }]
        : [];  // the memory notice: nothing to press

    // one notification per warning: shown once, its words updated in place as the end time
    // moves, replaced by the next warning, dismissed when none applies; the parked GPU's apart
    const show = status => {
      const wanted = notices(status, options.warnMinutes);
      for (const kind of Object.keys(shown)) {
        const next = wanted[kind];
        const change = noticeChange(shown[kind], next);
        if (change === 'dismiss' || change === 'replace') {
          Notification.dismiss(shown[kind].id);
          shown[kind] = null;
        }
        if (change === 'show' || change === 'replace') {
          const id = Notification.emit(next.message, next.kind, { autoClose: false, actions: actionsFor(next) });
          shown[kind] = { ...next, id };
        } else if (change === 'update') {
          Notification.update({ id: shown[kind].id, message: next.message, type: next.kind, autoClose: false,
                                actions: actionsFor(next) });
          shown[kind] = { ...next, id: shown[kind].id };
        }
      }
    };

    const read = async () => {
      let status = await call('GET', 'status');
      const failed = !!status.error;
      if (failed && last) {
        // one failed read (a busy hub) keeps what was last known, and says so in the tooltip
        status = { ...last, stale: status.error };
      } else if (!failed) {
        last = status;
      }
      const offered = item.hibernates;
      item.setStatus(status);
      if (item.hibernates !== offered) {
        app.commands.notifyCommandChanged(COMMAND);  // the palette shows or hides "Hibernate now"
      }
      if (!failed) {
        show(status);
        const move = moved(status);
        if (move && move.key !== movedShown) {
          movedShown = move.key;
          Notification.info(move.message, { autoClose: 10000 });
        }
      }
      return failed;
    };

    const start = () => {
      if (!reader) {
        reader = whileVisible(read, () => options.pollSeconds);
      }
    };
    if (settingRegistry) {
      settingRegistry.load(PLUGIN).then(settings => {
        const apply = () => {
          options.warnMinutes = settings.get('warnMinutesBefore').composite;
          options.pollSeconds = settings.get('pollSeconds').composite;
          if (reader) {
            void reader.now();
          }
        };
        settings.changed.connect(apply);
        apply();
        start();
      }).catch(start);
    }
    // the share shows as soon as the page can ask, not a poll interval later
    void app.restored.then(start);
    if (!settingRegistry) {
      start();
    }
  }
};

export default plugin;
