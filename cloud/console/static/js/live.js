// Live updates: the hub's event stream, or polling every 5 s while the stream is down.
//
// EventSource cannot send an Authorization header, so the stream takes the token as
// ?token=. A "change" event (new hub events) asks the page to refetch; changes that
// come in a burst are coalesced into one refetch a second at most.

import { token } from "./api.js";

const POLL_MS = 5000;
const COALESCE_MS = 1000;

export function startLive(onChange, onMode) {
  let source = null;
  let poll = null;
  let pending = null;
  let last = 0;
  let stopped = false;

  function changed() {
    if (pending || stopped) return;
    const wait = Math.max(0, last + COALESCE_MS - Date.now());
    pending = setTimeout(() => {
      pending = null;
      last = Date.now();
      onChange();
    }, wait);
  }

  function polling(on) {
    if (on && !poll) {
      poll = setInterval(changed, POLL_MS);
      onMode("polling", "the event stream is not available: refreshing every 5 s");
    } else if (!on && poll) {
      clearInterval(poll);
      poll = null;
    }
  }

  if (typeof EventSource === "function") {
    source = new EventSource(`/api/v1/events/stream?token=${encodeURIComponent(token())}`);
    source.addEventListener("open", () => {
      polling(false);
      onMode("live", "connected to the hub's event stream");
    });
    source.addEventListener("change", changed);
    source.addEventListener("error", () => {
      // CONNECTING: the browser retries by itself; CLOSED: it gave up (e.g. an HTTP
      // error). Either way poll until the stream is back.
      polling(true);
    });
  } else {
    polling(true);
  }

  return function stop() {
    stopped = true;
    source?.close();
    polling(false);
    clearTimeout(pending);
  };
}
