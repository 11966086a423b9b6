// Live updates: the hub's event stream, or polling every 5 s while the stream is down.
//
// The stream is read with fetch() and a stream reader rather than EventSource, so the
// token travels in the Authorization header as on every other request (EventSource
// cannot send headers, and a token in a URL ends up in logs and histories). A
// "change" event (new hub events) asks the page to refetch; changes that come in a
// burst are coalesced into one refetch a second at most.

import { token } from "./api.js";

const POLL_MS = 5000;
const COALESCE_MS = 1000;
const RETRY_MS = 30_000;

// Split server-sent-event text into events; returns [events, the unfinished rest].
function parseEvents(buffer) {
  const events = [];
  const blocks = buffer.split(/\r?\n\r?\n/);
  const rest = blocks.pop();
  for (const block of blocks) {
    let name = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(":")) continue; // a comment (heartbeat)
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    }
    if (data.length || name !== "message") events.push({ name, data: data.join("\n") });
  }
  return [events, rest];
}

export function startLive(onChange, onMode) {
  let poll = null;
  let pending = null;
  let last = 0;
  let stopped = false;
  let retry = null;
  let aborter = null;

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

  function lost() {
    if (stopped) return;
    polling(true);
    clearTimeout(retry);
    retry = setTimeout(connect, RETRY_MS);
  }

  async function connect() {
    if (stopped) return;
    aborter = new AbortController();
    try {
      const response = await fetch("/api/v1/events/stream", {
        headers: { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" },
        signal: aborter.signal,
        cache: "no-store",
      });
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      polling(false);
      onMode("live", "connected to the hub's event stream");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        let events;
        [events, buffer] = parseEvents(buffer + value);
        if (events.some((e) => e.name === "change")) changed();
      }
      lost(); // the hub ended the stream (it stopped or restarted)
    } catch (err) {
      if (!stopped) lost();
    }
  }

  if (typeof ReadableStream === "function" && typeof TextDecoderStream === "function") connect();
  else polling(true);

  return function stop() {
    stopped = true;
    aborter?.abort();
    polling(false);
    clearTimeout(pending);
    clearTimeout(retry);
  };
}
