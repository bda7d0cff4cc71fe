// "Hibernate now" in JupyterLab (issue #39): the same page of this server as the hub home page's
// button (gpupool/widgets/labserver.py HibernateNowPage), asked for JSON. It saves every kernel's
// variables, then this server stops and its GPU share is freed; nothing stops unless all were saved.

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const COMMAND = 'gpupool:hibernate-now';

async function post() {
  // ServerConnection sends the _xsrf cookie's token and the server's login, as JupyterLab's own calls do
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpupool', 'hibernate-now');
  try {
    const response = await ServerConnection.makeRequest(
      url, { method: 'POST', headers: { Accept: 'application/json' } }, settings);
    const body = await response.json().catch(() => null);
    if (body && typeof body.message === 'string') {
      return { ok: response.ok && body.ok === true, message: body.message };
    }
    return { ok: false, message: `the server answered ${response.status}` };
  } catch (err) {
    return { ok: false, message: String(err) };
  }
}

// `available`: whether the hub lets this user hibernate this server (the status's `hibernate`,
// false until it is read); where it is off the command is hidden from the palette and does nothing,
// and the server refuses the POST all the same
export function addHibernateCommand(app, palette, available) {
  app.commands.addCommand(COMMAND, {
    label: 'Hibernate now (gpupool)',
    caption: 'Save every kernel\'s variables, stop this server and free its GPU share',
    isEnabled: () => available(),
    isVisible: () => available(),
    execute: async () => {
      if (!available()) {
        return;
      }
      const asked = await showDialog({
        title: 'Hibernate this server?',
        body: 'The variables of every kernel are saved to your home, then this server stops and its '
          + 'GPU share is freed. They come back when you start it and open the notebook.',
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Hibernate' })]
      });
      if (!asked.button.accept) {
        return;
      }
      const pending = Notification.emit('Saving the kernels…', 'in-progress', { autoClose: false });
      const result = await post();
      Notification.update({
        id: pending,
        message: result.ok ? result.message : `Not hibernated: ${result.message}`,
        type: result.ok ? 'success' : 'error',
        autoClose: false
      });
    }
  });
  if (palette) {
    palette.addItem({ command: COMMAND, category: 'gpupool' });
  }
}
