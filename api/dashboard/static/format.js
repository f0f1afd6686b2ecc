// Small formatting and DOM helpers shared by the views.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function badge(text, kind = text) {
  return h("span", { class: `badge ${kind}` }, text);
}

export function bar(fraction, title) {
  const fill = h("span");
  fill.style.width = `${Math.round(Math.max(0, Math.min(1, fraction || 0)) * 100)}%`;
  return h("div", { class: "bar", title }, fill);
}

export function percent(value) {
  if (value === null || value === undefined) return "–";
  return `${(value * 100).toFixed(value > 0 && value < 0.1 ? 1 : 0)}%`;
}

export function number(value, digits = 2) {
  if (value === null || value === undefined) return "–";
  return Math.abs(value) >= 1000 ? Math.round(value).toLocaleString() : (+value.toFixed(digits)).toString();
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
  const hours = Math.floor(seconds / 3600);
  return hours < 48 ? `${hours}h ${Math.floor((seconds % 3600) / 60)}m` : `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function since(iso) {
  return iso ? (Date.now() - Date.parse(iso)) / 1000 : null;
}

export function ago(iso) {
  return iso ? `${duration(since(iso))} ago` : "–";
}

export function clock(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "–";
}

export function timestamp(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

// A job's completion time: submission to end, or so far while it has not ended.
export function jct(job) {
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return (end - Date.parse(job.created_at)) / 1000;
}

// SPB configuration as people read it: {} is plain data parallelism.
export function spbText(spb) {
  if (!spb || Object.keys(spb).length === 0) return "SPB off";
  if ("full_fraction" in spb && "partial_depth" in spb) {
    return `SPB ${percent(spb.full_fraction)} full · depth ${percent(spb.partial_depth)}`;
  }
  return "SPB " + Object.entries(spb).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

// A stable, distinct colour per job, so its GPUs are recognisable across nodes.
export function jobColor(jobId) {
  return `hsl(${(jobId * 137.508) % 360}, 65%, 45%)`;
}

export const STATES = ["QUEUED", "SCHEDULED", "RUNNING", "SUSPENDED", "SUCCEEDED", "FAILED", "CANCELLED"];
export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

// Where a waiting job stands: in its queue and among all waiting jobs.
export function positionText(job) {
  return `#${job.position.queue} in queue ${job.queue} · #${job.position.overall} overall`;
}
