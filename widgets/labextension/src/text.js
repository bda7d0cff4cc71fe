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
// "GPU 0.5 · moved to GPU 3 at 14:02 (to make room for a training job)"; "GPU …" until the
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
    return `no GPU${extraText(status)}`;
  }
  if (status.moved && status.moved_at && status.now - status.moved_at < MOVED_SHOWN_S) {
    return `GPU ${status.share} · ${status.moved}${extraText(status)}`;  // "moved to GPU 3 at 14:02 (…)"
  }
  const left = status.cull_at ? ` · ${minutesText(status.cull_at - status.now)} left` : '';
  return `GPU ${status.share}${left}${extraText(status)}`;
}

// After the share: the GPU-hour budget when near or over it, and when a queued train job starts.
export function extraText(status) {
  let out = '';
  const budget = status && status.budget;
  if (budget && budget.status === 'over') {
    out += ' · budget used up';
  } else if (budget && budget.status === 'near') {
    out += ` · budget ${budget.used_pct} %`;
  }
  const job = status && status.job;
  if (job && job.start) {
    const clock = new Date(job.start * 1000).toTimeString().slice(0, 5);
    out += ` · job ~${clock}`;
  } else if (job) {
    out += ' · job queued';
  }
  return out;
}

// The budget notification to show now, or null: once per state (near, then over).
export function budgetWarning(status) {
  const budget = status && !status.error ? status.budget : null;
  if (!budget || (budget.status !== 'near' && budget.status !== 'over')) {
    return null;
  }
  // short: JupyterLab cuts a notification at 140 characters (the tooltip has the whole message)
  // the hub's own text (gpupool.pool.units.format_gpu_hours): the same figures as the form's
  const used = `${budget.used_text || hoursText(budget.used_gpu_hours)} of ` +
    `${budget.limit_text || hoursText(budget.limit_gpu_hours)} GPU-h`;
  if (budget.status === 'near') {
    return { key: 'budget:near', message: `GPU-hour budget nearly used: ${used} (${budget.used_pct} %).` +
      ' Over it, new work is refused.' };
  }
  const until = budget.frees_at ? ` until ${clockText(budget.frees_at)}` : '';
  return { key: 'budget:over', message: `GPU-hour budget used up: ${used}. New work is refused${until};` +
    ' running work keeps running.' };
}

function hoursText(hours) {
  return Number(hours || 0).toFixed(1).replace(/\.0$/, '');
}

export function clockText(epoch) {
  const d = new Date(epoch * 1000);
  const day = d.toLocaleDateString('en-GB', { weekday: 'short' });
  return `${day} ${d.toTimeString().slice(0, 5)}`;
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

// The notifications that belong on screen for this status, one per slot: the culler's warning,
// the parked GPU's (kind "info") and the GPU-hour budget's, each null when it does not apply.
export function notices(status, warnMinutes) {
  const warn = warning(status, warnMinutes);
  const parked = status && !status.error && status.parked
    ? { kind: 'info', key: 'parked', message: `This server's GPU is parked: ${status.parked}`, extendable: false }
    : null;
  const budget = budgetWarning(status);  // gpupool.usage: near or over the GPU-hour budget
  // the kernel's OOM killer ended a process of this server (a kernel that died restarts with no
  // other word): said once per count, the key changes when another process is killed
  const killed = status && !status.error && status.memory_killed;
  const memory = killed
    ? { kind: 'error', key: `memory:${killed}`, extendable: false,
        message: `A process of this server was ${killed}. A kernel that died of it restarts empty:` +
          ' use less memory, or start the server with a larger size.' }
    : null;
  return { warning: warn ? { kind: 'warning', ...warn } : null, info: parked,
           budget: budget ? { kind: 'warning', ...budget, extendable: false } : null, memory };
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

// What a failed call to this server's gpupool endpoints says: the hub's proxy answers 424 (or
// 503) once the server was stopped — by the idle culler or from the hub — and a bare "HTTP 424"
// told the user nothing. `stopped` is true when Extend and Resume no longer apply.
export function callError(status, body) {
  if (status === 424 || status === 503 || status === 404) {
    return {
      error: 'This server is no longer running (stopped by the idle culler or from the hub):' +
        ' start it again from the hub\'s home page, which says why it stopped.',
      stopped: true
    };
  }
  return { error: (body && (body.error || body.message)) || `HTTP ${status}`, stopped: false };
}
