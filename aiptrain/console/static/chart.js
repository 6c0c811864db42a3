// Two small scatter charts as inline SVG, the console's own (no library): a tuning study's
// objective per trial with the best so far, and one parameter against the objective.
"use strict";

const chart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 480, H = 260, M = {left: 58, right: 16, top: 14, bottom: 40};

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function niceTicks(low, high, count = 5) {
    if (low === high) { low -= 1; high += 1; }
    const raw = (high - low) / count, power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((f) => f * power).find((s) => s >= raw);
    const ticks = [];
    for (let t = Math.ceil(low / step) * step; t <= high + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
    return ticks;
  }

  function label(value) {
    return Math.abs(value) >= 1e4 || (Math.abs(value) < 1e-3 && value !== 0) ? value.toExponential(1)
      : String(+value.toPrecision(4));
  }

  function frame(xTitle, yTitle) {
    const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img"});
    root.append(svg("rect", {x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom,
      class: "plot-area"}));
    root.append(svg("text", {x: (M.left + W - M.right) / 2, y: H - 6, class: "axis-title"}, xTitle));
    root.append(svg("text", {x: 14, y: (M.top + H - M.bottom) / 2, class: "axis-title",
      transform: `rotate(-90 14 ${(M.top + H - M.bottom) / 2})`}, yTitle));
    return root;
  }

  // A linear scale of [low, high] onto [from, to], padded so points sit off the edges.
  function scale(low, high, from, to) {
    if (low === high) { low -= Math.abs(low) * 0.1 || 1; high += Math.abs(high) * 0.1 || 1; }
    const pad = (high - low) * 0.06;
    low -= pad; high += pad;
    const map = (v) => from + ((v - low) / (high - low)) * (to - from);
    map.low = low; map.high = high;
    return map;
  }

  function yAxis(root, y) {
    for (const tick of niceTicks(y.low, y.high)) {
      if (tick < y.low || tick > y.high) continue;
      root.append(svg("line", {x1: M.left, x2: W - M.right, y1: y(tick), y2: y(tick), class: "grid"}));
      root.append(svg("text", {x: M.left - 6, y: y(tick) + 4, class: "tick end"}, label(tick)));
    }
  }

  function xTicks(root, x, ticks, text = label) {
    for (const tick of ticks) {
      root.append(svg("text", {x: x(tick), y: H - M.bottom + 16, class: "tick middle"}, text(tick)));
    }
  }

  function empty(message) {
    const root = frame("", "");
    root.append(svg("text", {x: W / 2, y: H / 2, class: "tick middle"}, message));
    return root;
  }

  // points: [{id, value, trial}] of the trials with an objective, in trial order.
  function objectivePerTrial(points, maximize) {
    if (!points.length) return empty("No trial has reported its objective yet.");
    const root = frame("Trial", "Objective");
    root.classList.add("chart-trials");
    const ids = points.map((p) => Number(p.id));
    const values = points.map((p) => p.value);
    const x = scale(Math.min(...ids), Math.max(...ids), M.left, W - M.right);
    const y = scale(Math.min(...values), Math.max(...values), H - M.bottom, M.top);
    yAxis(root, y);
    const step = Math.max(1, Math.ceil(ids.length / 10));
    xTicks(root, x, ids.filter((_, i) => i % step === 0), String);
    let best = null;
    const path = [];
    for (const point of points) {
      best = best === null ? point.value : maximize ? Math.max(best, point.value) : Math.min(best, point.value);
      path.push(`${path.length ? "L" : "M"}${x(Number(point.id)).toFixed(1)},${y(best).toFixed(1)}`);
    }
    root.append(svg("path", {d: path.join(" "), class: "best-line"}));
    for (const point of points) {
      const dot = svg("circle", {cx: x(Number(point.id)), cy: y(point.value), r: 5, class: "point",
        "data-trial": point.id});
      dot.append(svg("title", {}, `trial ${point.id}: ${point.value}`));
      root.append(dot);
    }
    return root;
  }

  // A numeric parameter on a linear (or log, by its scaleType) axis; a categorical one as columns.
  function parameterAgainstObjective(points, param) {
    const name = param.parameterName;
    const raw = points.map((p) => (p.trial.hyperparameters || {})[name]).filter((v) => v !== undefined);
    if (!raw.length) return empty("No trial has reported its objective yet.");
    const root = frame(name, "Objective");
    root.classList.add("chart-param");
    const values = points.map((p) => p.value);
    const y = scale(Math.min(...values), Math.max(...values), H - M.bottom, M.top);
    yAxis(root, y);
    const categorical = param.type === "CATEGORICAL";
    const log = param.scaleType === "UNIT_LOG_SCALE" && raw.every((v) => Number(v) > 0);
    let x, position;
    if (categorical) {
      const categories = param.categoricalValues || [...new Set(raw)];
      x = scale(0, Math.max(1, categories.length - 1), M.left, W - M.right);
      position = (v) => x(categories.indexOf(v));
      xTicks(root, x, categories.map((_, i) => i), (i) => categories[i]);
    } else {
      const numbers = raw.map(Number).map((v) => (log ? Math.log10(v) : v));
      x = scale(Math.min(...numbers), Math.max(...numbers), M.left, W - M.right);
      position = (v) => x(log ? Math.log10(Number(v)) : Number(v));
      xTicks(root, x, niceTicks(x.low, x.high).filter((t) => t >= x.low && t <= x.high),
        (t) => label(log ? 10 ** t : t));
    }
    for (const point of points) {
      const value = (point.trial.hyperparameters || {})[name];
      if (value === undefined) continue;
      const dot = svg("circle", {cx: position(value), cy: y(point.value), r: 5, class: "point",
        "data-trial": point.id});
      dot.append(svg("title", {}, `trial ${point.id}: ${name}=${value}, objective ${point.value}`));
      root.append(dot);
    }
    return root;
  }

  return {objectivePerTrial, parameterAgainstObjective};
})();
