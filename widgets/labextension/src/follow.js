// A train job's log box (gpupool.widgets.ansi.log_box, in a JobMonitor) shows its last lines:
// each refresh puts a new box in the page, scrolled to its end unless the reader scrolled up in
// the one before it (then the new one keeps their place). The kernel sends only HTML; this is
// the page's part, for every notebook of this JupyterLab.

const BOX = '.gpupool-log';

function atEnd(box) {
  return box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
}

export function followLogs(root) {
  // where each output's reader left its box: the box's parent stays while its HTML is replaced
  const readerPlace = new WeakMap();
  root.addEventListener('scroll', event => {
    const box = event.target;
    if (box instanceof Element && box.matches(BOX) && box.parentElement) {
      readerPlace.set(box.parentElement, atEnd(box) ? null : box.scrollTop);
    }
  }, true);
  const place = box => {
    const kept = box.parentElement ? readerPlace.get(box.parentElement) : null;
    box.scrollTop = kept === null || kept === undefined ? box.scrollHeight : kept;
  };
  const observer = new MutationObserver(records => {
    for (const record of records) {
      for (const node of record.addedNodes) {
        if (!(node instanceof Element)) {
          continue;
        }
        if (node.matches(BOX)) {
          place(node);
        }
        node.querySelectorAll(BOX).forEach(place);
      }
    }
  });
  observer.observe(root, { childList: true, subtree: true });
  return observer;
}
