// Calls to this server's gpupool endpoints (gpupool/widgets/labserver.py), and a timer that reads
// only while the page is visible: a hidden tab sends nothing, so the hub's proxy sees no activity.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { callError } from './text.js';

export async function call(method, path) {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpupool', path);
  let response;
  try {
    response = await ServerConnection.makeRequest(url, { method }, settings);
  } catch (err) {
    return { error: String(err) };
  }
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    body = null;  // the hub's proxy answers a stopped server with a page, not JSON
  }
  if (!response.ok) {
    return { ...(body || {}), ...callError(response.status, body) };
  }
  return body || {};
}

// Run `read` now and then every `seconds()` while the document is visible (at once when it comes
// back); `read` returns true when it failed, and a failure is retried soon (2 s, doubling) rather
// than a whole interval later. Returns a function that stops it.
export function whileVisible(read, seconds) {
  let timer = 0;
  let stopped = false;
  let retry = 2;
  let busy = false;
  const run = async () => {
    window.clearTimeout(timer);
    if (stopped || busy || document.hidden) {
      return;
    }
    busy = true;
    let failed = true;
    try {
      failed = await read();
    } finally {
      busy = false;
    }
    if (stopped) {
      return;
    }
    const wait = failed ? Math.min(retry, seconds()) : seconds();
    retry = failed ? retry * 2 : 2;
    timer = window.setTimeout(run, wait * 1000);
  };
  const visible = () => {
    if (!document.hidden) {
      void run();
    }
  };
  document.addEventListener('visibilitychange', visible);
  void run();
  return {
    now: () => run(),
    stop: () => {
      stopped = true;
      window.clearTimeout(timer);
      document.removeEventListener('visibilitychange', visible);
    }
  };
}
