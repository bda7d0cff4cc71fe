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

// The status bar's text: "GPU 0.25 · 1 h 20 min left", "GPU parked", "no GPU"; "GPU …" until the
// first answer, "GPU ?" when none came.
export function itemText(status) {
  if (!status) {
    return 'GPU …';
  }
  if (status.error) {
    return 'GPU ?';
  }
  if (status.parked) {
    return status.share ? `GPU ${status.share} · parked` : 'GPU parked';
  }
  if (!status.share) {
    return 'no GPU';
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
// stops within `warnMinutes`; `key` tells one warning from the next (one notification each): the
// reason, not the end time, which moves a little at each of the culler's passes.
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
  return { key: `warn:${status.reason}`, message, extendable: !!status.extendable };
}

// The notifications that belong on screen for this status, one per kind: the warning (kind
// "warning") and the parked GPU's (kind "info"), each null when it does not apply.
export function notices(status, warnMinutes) {
  const warn = warning(status, warnMinutes);
  const parked = status && !status.error && status.parked
    ? { kind: 'info', key: 'parked', message: `This server's GPU is parked: ${status.parked}`, extendable: false }
    : null;
  return { warning: warn ? { kind: 'warning', ...warn } : null, info: parked };
}

// What to do with the notification on screen (`shown`, or null) to show `next`: "none", "show",
// "update" (same warning, new words: in place), "replace" (another warning) or "dismiss" (none
// applies any more: the GPU came back, the session was extended).
export function noticeChange(shown, next) {
  if (!next) {
    return shown ? 'dismiss' : 'none';
  }
  if (!shown) {
    return 'show';
  }
  if (shown.key !== next.key) {
    return 'replace';
  }
  return shown.message !== next.message || shown.extendable !== next.extendable ? 'update' : 'none';
}
