// The chat page: streams answers from /v1/chat/completions and shows speed and cache state;
// the savings panel polls /v1/reame/stats and plots tokens served and computed per second.
// `?ask=TEXT` sends TEXT once the page has loaded; body[data-state] becomes "done" or "error"
// when an answer ends, so a headless browser can tell when a round trip is complete.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];
let modelId = null;

function apiKey() { return localStorage.getItem("reame-api-key") || ""; }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h["Authorization"] = "Bearer " + apiKey();
  return h;
}

async function loadHealth() {
  try {
    const health = await (await fetch("/health", { headers: headers() })).json();  // details need the key
    if (!health.model) {  // a node with keys: without the right one, /health says only its status
      $("archive").textContent = "node " + health.status + " (type the API key for details)";
      return;
    }
    modelId = health.model;
    $("model").textContent = "model: " + health.model;
    $("archive").textContent = "archive: " + health.archive;
  } catch (err) {
    $("archive").textContent = "node unreachable";
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.appendChild(body);
  $("log").appendChild(div);
  return div;
}

// Reads an SSE body and calls onEvent(eventName, dataText) for every complete event.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message", data = "";
      for (const line of frame.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      onEvent(name, data);
    }
  }
}

async function send(text) {
  $("error").textContent = "";
  document.body.dataset.state = "busy";
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const bubble = addMessage("assistant", "");
  const out = bubble.querySelector(".text");
  const started = performance.now();
  let firstAt = null, usage = null, finish = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(),
      body: JSON.stringify({
        model: modelId || undefined, messages: history, stream: true,
        stream_options: { include_usage: true },
        temperature: Number($("temperature").value), max_tokens: Number($("max-tokens").value),
      }),
    });
    const cache = response.headers.get("X-Reame-Cache") || "–";
    $("cache").textContent = "cache: " + cache;
    $("cache").classList.toggle("hit", cache === "hit");
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || response.statusText);
    }
    await readEvents(response, (name, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (name === "error" || chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        if (choice.delta && choice.delta.content) {
          if (firstAt === null) firstAt = performance.now();
          out.textContent += choice.delta.content;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    const ended = performance.now();
    const tokens = usage ? usage.completion_tokens : 0;
    const seconds = Math.max((ended - (firstAt || started)) / 1000, 1e-3);
    const speed = cache === "hit" ? "cached" : (tokens / seconds).toFixed(1) + " tok/s";
    $("speed").textContent = speed;
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = `${tokens} tokens · ${speed} · ${((ended - started) / 1000).toFixed(2)} s · ` +
                       `cache ${cache} · ${finish || "?"}`;
    bubble.appendChild(meta);
    history.push({ role: "assistant", content: out.textContent });
    document.body.dataset.state = "done";
  } catch (err) {
    history.pop();
    $("error").textContent = String(err.message || err);
    document.body.dataset.state = "error";
  }
}

function percent(share) { return Math.round(share * 100) + "%"; }

// Polyline points for `values` in a 300x60 box, scaled to `top`.
function polyline(values, top) {
  if (values.length < 2) return "";
  return values.map((v, i) => {
    const x = (i / (values.length - 1)) * 300;
    const y = 58 - (Math.max(v || 0, 0) / top) * 56;
    return x.toFixed(1) + "," + y.toFixed(1);
  }).join(" ");
}

async function loadSavings() {
  let stats;
  try {
    const response = await fetch("/v1/reame/stats", { headers: headers() });
    if (!response.ok) return;
    stats = await response.json();
  } catch (err) {
    return;
  }
  const total = stats.since_start, saved = total.saved;
  $("saved-served").textContent = "served " + total.tokens_served + " tokens";
  $("saved-computed").textContent = "computed " + total.tokens_computed;
  $("saved-tiers").textContent = "L1 " + percent(saved.l1.share) + " · prefix " + percent(saved.prefix.share) +
                                 " · drafts " + percent(saved.drafts.share);
  const speed = total.effective_tokens_per_second;
  $("saved-speed").textContent = "effective " + (speed === null ? "–" : speed.toFixed(1)) + " tok/s" +
                                 (total.speedup === null ? "" : " = " + total.speedup.toFixed(2) + " x plain");
  const served = stats.trend.map((p) => p.served_per_second || 0);
  const computed = stats.trend.map((p) => p.computed_per_second || 0);
  const top = Math.max(1, ...served, ...computed);
  $("trend-served").setAttribute("points", polyline(served, top));
  $("trend-computed").setAttribute("points", polyline(computed, top));
  $("savings").dataset.points = String(stats.trend.length);
}

$("api-key").value = apiKey();
$("api-key").addEventListener("change", (e) => {
  localStorage.setItem("reame-api-key", e.target.value);
  loadHealth();  // with the key, /health names the model and the archive
});
$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || document.body.dataset.state === "busy") return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); }
});
$("reset").addEventListener("click", () => { history.length = 0; $("log").textContent = ""; });

loadSavings();
setInterval(loadSavings, 5000);
loadHealth().then(() => {
  const ask = new URLSearchParams(location.search).get("ask");
  if (ask) send(ask);
});
