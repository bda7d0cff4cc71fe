// %gpupool's output in JupyterLab and Notebook 7: this workspace's share, use, end time, quota and
// projects, with Extend and Resume. The kernel shows it once; the page reads it again every
// 30 s while it is visible (this server's gpupool/workspace endpoint), so keeping it current is no
// kernel traffic and no user activity, and a hidden or closed tab reads nothing.

import { Widget } from '@lumino/widgets';

import { call, whileVisible } from './api.js';

const MIME_TYPE = 'application/vnd.gpupool.workspace+json';
const SECONDS = 30;

class WorkspaceView extends Widget {
  constructor() {
    super();
    this.addClass('gpupool-Workspace');
    this.reader = null;
    const title = document.createElement('b');
    title.textContent = 'gpupool workspace';
    this.table = document.createElement('table');
    this.message = document.createElement('div');
    this.message.className = 'gpupool-Workspace-message';
    this.extendButton = this.button('Extend session', 'Ask the idle culler for more time (once per session)',
                                    () => this.act('extend', 'Extended: the idle culler gives this session more time once.'));
    this.resumeButton = this.button('Resume GPU', 'Ask for the parked GPU back', () => this.act('resume', ''));
    const buttons = document.createElement('div');
    buttons.append(this.extendButton, this.resumeButton);
    this.node.append(title, this.table, this.message, buttons);
  }

  button(label, caption, onClick) {
    const b = document.createElement('button');
    b.className = 'jp-mod-styled jp-mod-accept';
    b.textContent = label;
    b.title = caption;
    b.style.marginRight = '6px';
    b.addEventListener('click', onClick);
    return b;
  }

  async act(path, done) {
    const result = await call('POST', path);
    this.message.style.color = result.error ? 'var(--jp-error-color1)' : '';
    this.message.textContent = result.error || result.message || done;
    if (this.reader) {
      await this.reader.now();
    }
  }

  show(view) {
    if (view.error) {
      this.message.style.color = 'var(--jp-error-color1)';
      this.message.textContent = view.error;
      if (view.stopped) {  // culled or stopped: nothing left to extend or resume
        this.extendButton.disabled = true;
        this.resumeButton.style.display = 'none';
      }
      return;
    }
    this.table.replaceChildren(...(view.rows || []).map(([label, value]) => {
      const tr = document.createElement('tr');
      const k = document.createElement('td');
      k.style.paddingRight = '1em';
      k.style.verticalAlign = 'top';
      k.textContent = label;
      const v = document.createElement('td');
      v.textContent = value;
      tr.append(k, v);
      return tr;
    }));
    this.extendButton.disabled = !view.extendable;
    this.resumeButton.style.display = view.parked ? '' : 'none';
  }

  renderModel(model) {
    this.show(model.data[MIME_TYPE] || {});
    if (!this.reader) {
      // the snapshot the kernel sent shows at once; then the page keeps it current
      let first = true;
      this.reader = whileVisible(async () => {
        if (first) {
          first = false;
          return false;
        }
        const view = await call('GET', 'workspace');
        this.show(view);
        return !!view.error;
      }, () => SECONDS);
    }
    return Promise.resolve();
  }

  dispose() {
    if (this.reader) {
      this.reader.stop();
      this.reader = null;
    }
    super.dispose();
  }
}

const extension = {
  id: 'gpupool-lab:workspace',
  rendererFactory: { safe: true, mimeTypes: [MIME_TYPE], createRenderer: () => new WorkspaceView() },
  rank: 0,
  dataType: 'json'
};

export default extension;
