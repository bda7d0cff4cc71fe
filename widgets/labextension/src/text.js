// What the status item and the notification say: pure functions of the server's answer
// (GET <base>/gpupool/status, see gpupool/widgets/labserver.py), kept apart so node can test them.

export function minutesText(seconds) {
  const minutes = Math.max(0, Math.floor(seconds / 60));
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const rest = minutes % 60;
  return rest ? `${Math.floor(minutes / 60)} h ${rest} min` : `${Math.floor(minutes / 60)} h`;
}

// How long the status bar says where the kernel was moved (gpupool's mover); the tooltip keeps it.
export const MOVED_SHOWN_S = 15 * 60;

// The status bar's text: "GPU 0.25 · 1 h 20 min left", "GPU parked", "no GPU",
// "GPU 0.5 · moved to GPU 3 at 14:02 (to make room for a training job)".
export function itemText(status) {
  if (!status || status.error) {
    return 'GPU ?';
  }
  if (status.parked) {
    return `GPU ${status.share} · parked`;
  }
  if (!status.share) {
    return 'no GPU';
  }
  if (status.moved && status.moved_at && status.now - status.moved_at < MOVED_SHOWN_S) {
    return `GPU ${status.share} · ${status.moved}`;  // "moved to GPU 3 at 14:02 (to make room for …)"
  }
  const left = status.cull_at ? ` · ${minutesText(status.cull_at - status.now)} left` : '';
  return `GPU ${status.share}${left}`;
}

// The tooltip: every line the server sent, in plain words.
export function itemTitle(status) {
  if (!status) {
    return 'gpupool: reading the GPU share…';
  }
  if (status.error) {
    return `gpupool: ${status.error}`;
  }
  const stale = status.stale ? [`(not updated just now: ${status.stale})`] : [];
  return ['gpupool', ...(status.lines || []), ...stale].join('\n');
}

// The warning to show now, or null. Shown when the culler itself warns, or when the server
// stops within `warnMinutes`; `key` tells one warning from the next (one notification each).
export function warning(status, warnMinutes) {
  if (!status || status.error || !status.cull_at) {
    return null;
  }
  const left = status.cull_at - status.now;
  if (status.action !== 'warn' && left > warnMinutes * 60) {
    return null;
  }
  const why = status.reason_text ? ` ${status.reason_text}` : '';
  const message = status.message && status.action === 'warn'
    ? `This server ${status.message}`
    : `This server stops in ${minutesText(left)}${why}: save your work.`;
  return { key: `${status.reason}:${status.cull_at}`, message, extendable: !!status.extendable };
}

// The notification for a move, once per move (`key`), or null.
export function moved(status) {
  if (!status || status.error || !status.moved || !status.moved_at) {
    return null;
  }
  if (status.now - status.moved_at >= MOVED_SHOWN_S) {
    return null;
  }
  return { key: `moved:${status.moved_at}`, message: `Your kernel ${status.moved}. Nothing restarted.` };
}
