// Line charts drawn as SVG, with nice ticks, a legend and an empty state; no library.
import { h, number } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";
const H = 170, PAD = { left: 46, right: 10, top: 8, bottom: 22 };

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, value);
  if (text !== undefined) el.textContent = text;
  return el;
}

// About `count` round-valued ticks from at or below `low` to at or above `high`.
function ticks(low, high, count = 4) {
  if (low === high) { low -= 1; high += 1; }
  const raw = (high - low) / count;
  const step = [1, 2, 5, 10].map((m) => m * 10 ** Math.floor(Math.log10(raw))).find((v) => v >= raw);
  const out = [];
  const end = Math.ceil(high / step) * step + step * 1e-9;
  for (let v = Math.floor(low / step) * step; v <= end; v += step) out.push(+v.toPrecision(12));
  return out;
}

/**
 * series: [{name, color, points: [[x, y], ...]}]; y null marks a gap.
 * Options: title, unit (appended to y ticks), zero (y axis from 0), empty (text when no data),
 * xFormat (tick text of x), width (of the drawing in px at scale 1; it scales to fit).
 */
export function lineChart({ title, series, unit = "", zero = true, empty = "No data yet", xFormat = number, id, width = 480 }) {
  const W = width;
  const points = series.flatMap((line) => line.points.filter((p) => p[1] !== null && p[1] !== undefined));
  const box = h("div", { class: "chart panel", "data-chart": id || title, "data-points": points.length });
  box.append(h("h3", {}, title));
  if (points.length === 0) {
    box.append(h("div", { class: "empty" }, empty));
    return box;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const yTicks = ticks(zero ? Math.min(0, ...ys) : Math.min(...ys), Math.max(...ys));
  const [x0, x1] = [Math.min(...xs), Math.max(...xs) === Math.min(...xs) ? Math.min(...xs) + 1 : Math.max(...xs)];
  const [y0, y1] = [yTicks[0], yTicks[yTicks.length - 1]];
  const px = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const py = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0 || 1)) * (H - PAD.top - PAD.bottom);

  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  for (const y of yTicks) {
    svg.append(s("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: py(y), y2: py(y) }));
    svg.append(s("text", { x: PAD.left - 4, y: py(y) + 3, "text-anchor": "end" }, number(y, 3) + unit));
  }
  for (const x of ticks(x0, x1, 5).filter((v) => v >= x0 && v <= x1)) {
    svg.append(s("text", { x: px(x), y: H - 6, "text-anchor": "middle" }, xFormat(x)));
  }
  for (const line of series) {
    let d = "", pen = false;
    for (const [x, y] of line.points) {
      if (y === null || y === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`;
      pen = true;
    }
    if (!d) continue;
    svg.append(s("path", { d, fill: "none", stroke: line.color, "stroke-width": 1.6, "vector-effect": "non-scaling-stroke" }));
    if (line.points.length === 1) {
      const [x, y] = line.points[0];
      svg.append(s("circle", { cx: px(x), cy: py(y), r: 2.5, fill: line.color }));
    }
  }
  box.append(svg);
  if (series.length > 1) {
    box.append(h("div", { class: "legend" }, series.map((line) => {
      const swatch = h("i");
      swatch.style.background = line.color;
      return h("span", {}, swatch, line.name);
    })));
  }
  return box;
}
