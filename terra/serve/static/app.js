// The terra-serve page: open a session, drive it with the arrow keys over its WebSocket, draw frames and path.
// Protocol: terra/serve/sockets.py (messages) and terra/serve/media.py (binary frame messages).
"use strict";

const $ = (id) => document.getElementById(id);
const KEYMAP = { ArrowUp: "up", KeyW: "up", ArrowDown: "down", KeyS: "down", ArrowLeft: "left", KeyA: "left",
                 ArrowRight: "right", KeyD: "right" };
const state = { token: new URLSearchParams(location.search).get("token") || sessionStorage.getItem("terraToken"),
                session: null, socket: null, driving: false, keys: { up: false, down: false, left: false, right: false },
                poses: [], path: [], times: [], speed: 30 };
// Read by the browser test (tests/serve/test_browser.py) and handy in the console.
window.terraStats = { frames: 0, lastIndex: -1, errors: [], connected: false, contextShown: false };

function showError(message) {
  $("error").textContent = message || "";
  if (message) window.terraStats.errors.push(message);
}

function setStatus(text) { $("status").textContent = text; }

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (!response.ok) {
    let message = `${response.status}`;
    try { message = (await response.json()).error || message; } catch (err) { /* not JSON */ }
    if (response.status === 401) $("token-field").hidden = false;
    throw new Error(message);
  }
  return response;
}

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`cannot read ${file.name}`));
    reader.readAsDataURL(file);
  });
}

async function sessionSpec() {
  const spec = { seed: Number($("seed").value), sampling: { temperature: Number($("temperature").value) } };
  const speed = Number($("speed").value);
  if (document.querySelector("input[name=source]:checked").value === "upload") {
    const files = Array.from($("files").files);
    if (!files.length) throw new Error("choose one or more context images to upload");
    spec.context = { images: await Promise.all(files.map(readFile)), speed_kmh: speed };
  } else {
    spec.context = { builtin: { manoeuvre: $("manoeuvre").value, scene: Number($("scene").value), speed_kmh: speed } };
  }
  return spec;
}

async function start() {
  showError("");
  if ($("token").value) { state.token = $("token").value; sessionStorage.setItem("terraToken", state.token); }
  if (state.socket) state.socket.close(1000, "new session");
  if (state.session) api(`/sessions/${state.session.id}`, { method: "DELETE" }).catch(() => {});
  try {
    setStatus("opening a session…");
    const spec = await sessionSpec();
    state.session = await (await api("/sessions", { method: "POST", body: JSON.stringify(spec) })).json();
    connect(state.session.id);
  } catch (err) {
    setStatus("not connected");
    showError(err.message);
  }
}

function connect(id) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const protocols = state.token ? ["terra", `bearer.${state.token}`] : ["terra"];
  const socket = new WebSocket(`${scheme}://${location.host}/sessions/${id}/ws`, protocols);
  socket.binaryType = "arraybuffer";
  state.socket = socket;
  state.poses = []; state.path = []; state.times = []; state.driving = false;
  socket.onopen = () => { window.terraStats.connected = true; };
  socket.onmessage = (event) => (typeof event.data === "string" ? onText(JSON.parse(event.data)) : onFrame(event.data));
  socket.onclose = (event) => {
    if (state.socket !== socket) return;
    window.terraStats.connected = false;
    setStatus(`disconnected${event.reason ? `: ${event.reason}` : ""}`);
    enable(false);
  };
}

async function drawContext(dataUrl) {
  // The last context frame: the view shows where the car stands before the first generated frame arrives.
  if (!dataUrl) return;
  const bitmap = await createImageBitmap(await (await fetch(dataUrl)).blob());
  const view = $("view");
  view.getContext("2d").drawImage(bitmap, 0, 0, view.width, view.height);
  window.terraStats.contextShown = true;
  drawMap();
}

function onText(message) {
  if (message.type === "ready") {
    state.speed = message.session.speed_kmh;
    setStatus(`session ${message.session.id}: ${message.session.context}. Press an arrow key to drive.`);
    enable(true);
    drawContext(message.context_frame);
  } else if (message.type === "reset") {
    state.poses = []; state.path = []; window.terraStats.lastIndex = -1;
    setStatus(`session ${message.session.id} reset`);
    drawContext(message.context_frame);
  } else if (message.type === "error") {
    showError(message.message);
  }
}

async function onFrame(buffer) {
  const length = new DataView(buffer).getUint32(0);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, length)));
  const blob = new Blob([new Uint8Array(buffer, 4 + length)], { type: `image/${header.format}` });
  const bitmap = await createImageBitmap(blob);
  const view = $("view");
  view.getContext("2d").drawImage(bitmap, 0, 0, view.width, view.height);
  if (state.driving) send({ type: "ack", index: header.index });
  const now = performance.now();
  state.times = state.times.filter((t) => now - t < 3000).concat(now);
  state.poses.push(header.pose);
  state.path = header.path;
  state.speed = header.speed_kmh;
  window.terraStats.frames += 1;
  window.terraStats.lastIndex = header.index;
  $("frame-index").textContent = header.index;
  $("fps").textContent = (state.times.length / 3).toFixed(1);
  $("latency").textContent = `${Math.round(header.timings.total_s * 1000)} ms`;
  $("speed-now").textContent = `${header.speed_kmh.toFixed(0)} km/h`;
  drawMap();
}

function drawMap() {
  const canvas = $("map");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const pose = state.poses.length ? state.poses[state.poses.length - 1] : [0, 0, 0];
  const scale = 4; // pixels per metre; x forward is up, y left is left, centred on the car
  const toCanvas = (x, y) => [canvas.width / 2 - (y - pose[1]) * scale, canvas.height * 0.65 - (x - pose[0]) * scale];
  ctx.strokeStyle = "#5b8def"; ctx.lineWidth = 2; ctx.beginPath();
  [[0, 0, 0], ...state.poses].forEach((p, i) => { const [u, v] = toCanvas(p[0], p[1]); i ? ctx.lineTo(u, v) : ctx.moveTo(u, v); });
  ctx.stroke();
  const c = Math.cos(pose[2]); const s = Math.sin(pose[2]);
  ctx.strokeStyle = "#f0a030"; ctx.setLineDash([4, 3]); ctx.beginPath(); // the commanded path ahead
  [[0, 0], ...state.path].forEach(([x, y], i) => {
    const [u, v] = toCanvas(pose[0] + c * x - s * y, pose[1] + s * x + c * y);
    i ? ctx.lineTo(u, v) : ctx.moveTo(u, v);
  });
  ctx.stroke(); ctx.setLineDash([]);
  const [u, v] = toCanvas(pose[0], pose[1]);
  ctx.fillStyle = "#f0a030"; ctx.beginPath(); ctx.arc(u, v, 4, 0, 2 * Math.PI); ctx.fill();
}

function send(message) {
  if (state.socket && state.socket.readyState === WebSocket.OPEN) state.socket.send(JSON.stringify(message));
}

function setDriving(on) {
  state.driving = on;
  $("drive").textContent = on ? "Pause" : "Drive";
  $("drive").classList.toggle("on", on);
  if (state.session) setStatus(`session ${state.session.id}: ${on ? "driving (arrow keys steer and change speed)" : "paused"}`);
  send({ type: "drive", on });
}

function setKey(key, down) {
  if (!state.socket || state.keys[key] === down) return;
  state.keys[key] = down;
  document.querySelector(`.key[data-key=${key}]`).classList.toggle("held", down);
  send({ type: "keys", keys: { [key]: down } });
  if (down && !state.driving) setDriving(true);
}

function enable(on) {
  for (const id of ["drive", "step", "reset", "mp4", "gif"]) $(id).disabled = !on;
}

async function download(format) {
  try {
    const response = await api(`/sessions/${state.session.id}/video?format=${format}`);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(await response.blob());
    link.download = `terra-${state.session.id}.${format}`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  } catch (err) {
    showError(err.message);
  }
}

document.addEventListener("keydown", (event) => {
  if (KEYMAP[event.code] && event.target.tagName !== "INPUT") { event.preventDefault(); setKey(KEYMAP[event.code], true); }
});
document.addEventListener("keyup", (event) => { if (KEYMAP[event.code]) setKey(KEYMAP[event.code], false); });
for (const button of document.querySelectorAll(".key")) {
  button.addEventListener("pointerdown", () => setKey(button.dataset.key, true));
  for (const type of ["pointerup", "pointerleave"]) button.addEventListener(type, () => setKey(button.dataset.key, false));
}
$("start").addEventListener("click", start);
$("drive").addEventListener("click", () => setDriving(!state.driving));
$("step").addEventListener("click", () => {
  const steer = (state.keys.left ? 1 : 0) - (state.keys.right ? 1 : 0);
  send({ type: "step", action: { steer, speed_kmh: Math.max(0, Math.min(130, state.speed)) } });
});
$("reset").addEventListener("click", () => send({ type: "reset" }));
$("mp4").addEventListener("click", () => download("mp4"));
$("gif").addEventListener("click", () => download("gif"));
fetch("/health").then((r) => r.json()).then((health) => {
  if (health.token_required && !state.token) $("token-field").hidden = false;
  setStatus(`model ready (${health.backend}); start a session`);
}).catch(() => setStatus("server not reachable"));
drawMap();
