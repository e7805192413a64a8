// Drydock dashboard: the page behaviour that HTML alone cannot give. No network calls: data
// arrives in the page (a JSON script element), charts are drawn by the vendored Chart.js.
"use strict";

// Draw the training loss, the evaluations made during training and the learning rate (second
// axis) from the JSON in #dataId; checkboxes #<canvasId minus "-chart">-log and -smooth switch a
// log scale and an exponential moving average of the training loss (remembered by the browser).
function drydockLossChart(canvasId, dataId) {
  const series = JSON.parse(document.getElementById(dataId).textContent);
  const points = (xs, ys) => xs.map((x, i) => ({ x: x, y: ys[i] }));
  const smooth = (ys, alpha) => {
    let last = null;
    return ys.map((y) => (y === null ? null : (last = last === null ? y : alpha * y + (1 - alpha) * last)));
  };
  const base = canvasId.replace(/-chart$/, "");
  const logBox = document.getElementById(base + "-log");
  const smoothBox = document.getElementById(base + "-smooth");
  const remembered = (box) => box && (box.checked = localStorage.getItem("drydock:" + box.id) === "1");
  remembered(logBox);
  remembered(smoothBox);
  const datasets = [{
    label: "train loss", data: points(series.steps, series.loss), yAxisID: "y",
    borderColor: "#1565c0", backgroundColor: "#1565c0", borderWidth: 1.5, pointRadius: 0,
  }];
  if (series.eval_steps && series.eval_steps.length) {
    datasets.push({
      label: "eval loss", data: points(series.eval_steps, series.eval_loss), yAxisID: "y",
      borderColor: "#c62828", backgroundColor: "#c62828", borderWidth: 1.5, pointRadius: 3, borderDash: [5, 4],
    });
  }
  if (series.prediction && series.prediction.length) {
    // The predicted eval loss: its band (low to high, filled) and its curve.
    const at = (i) => series.prediction.map((p) => ({ x: p[0], y: p[i] }));
    datasets.push({
      label: "predicted (low)", data: at(2), yAxisID: "y", borderColor: "rgba(46,125,50,0)",
      backgroundColor: "rgba(46,125,50,0.12)", pointRadius: 0, fill: false,
    });
    datasets.push({
      label: "predicted interval", data: at(3), yAxisID: "y", borderColor: "rgba(46,125,50,0)",
      backgroundColor: "rgba(46,125,50,0.12)", pointRadius: 0, fill: "-1",
    });
    datasets.push({
      label: "predicted eval loss", data: at(1), yAxisID: "y", borderColor: "#2e7d32",
      backgroundColor: "#2e7d32", borderWidth: 1.5, pointRadius: 0, borderDash: [2, 2],
    });
  }
  if (series.events && series.events.length) {
    // Interventions: a marker at the step, at its loss (NaN/Inf and unknown losses at the top).
    const finite = series.loss.filter((v) => v !== null);
    const top = finite.length ? Math.max(...finite) : 1;
    datasets.push({
      label: "interventions", type: "scatter", yAxisID: "y",
      data: series.events.map((e) => ({ x: e.step, y: e.loss === null ? top : Math.min(e.loss, top), message: e.message })),
      borderColor: "#6a1b9a", backgroundColor: "#6a1b9a", pointStyle: "triangle", pointRadius: 6,
    });
  }
  const scales = {
    x: { type: "linear", title: { display: true, text: "step" } },
    y: { type: "linear", position: "left", title: { display: true, text: "loss" } },
  };
  if (series.planned_steps) {
    scales.x.min = 0;
    scales.x.max = series.planned_steps;
  }
  if (series.learning_rate.some((v) => v !== null)) {
    datasets.push({
      label: "learning rate", data: points(series.steps, series.learning_rate), yAxisID: "lr",
      borderColor: "#ef6c00", backgroundColor: "#ef6c00", borderWidth: 1, pointRadius: 0, borderDash: [4, 3],
    });
    scales.lr = { type: "linear", position: "right", grid: { drawOnChartArea: false },
                  title: { display: true, text: "learning rate" } };
  }
  const chart = new Chart(document.getElementById(canvasId), {
    type: "line",
    data: { datasets: datasets },
    options: {
      // No animation: the chart is complete as soon as the page has loaded (and so is a screenshot).
      animation: false, parsing: false, normalized: true, maintainAspectRatio: false,
      interaction: { mode: "nearest", axis: "x", intersect: false },
      scales: scales,
      plugins: {
        tooltip: { callbacks: { label: (item) => item.raw.message || `${item.dataset.label}: ${item.formattedValue}` } },
        legend: { labels: { filter: (item) => item.text !== "predicted (low)" } },
      },
    },
  });
  const apply = () => {
    chart.options.scales.y.type = logBox && logBox.checked ? "logarithmic" : "linear";
    const ys = smoothBox && smoothBox.checked ? smooth(series.loss, 0.1) : series.loss;
    chart.data.datasets[0].data = points(series.steps, ys);
    chart.update();
  };
  [logBox, smoothBox].forEach((box) => box && box.addEventListener("change", () => {
    localStorage.setItem("drydock:" + box.id, box.checked ? "1" : "0");
    apply();
  }));
  apply();
  return chart;
}

// Make the DAG's nodes (drawn by pipeline.dag_render, which knows nothing of URLs) open their step.
function drydockDagLinks(stepUrl, experimentId) {
  document.querySelectorAll("#dag g.node").forEach((node) => {
    const label = node.getAttribute("data-label");
    const path = label.split("/").map(encodeURIComponent).join("/");
    node.style.cursor = "pointer";
    node.addEventListener("click", () => {
      window.location.href = stepUrl.replace("__LABEL__", path) + "?experiment=" + encodeURIComponent(experimentId);
    });
  });
}

const DRYDOCK_COLORS = ["#1565c0", "#c62828", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#5d4037", "#ad1457"];

// One colour per group (a swept value: "learning_rate=0.003"), in the order groups first appear.
function drydockGroupColors(items) {
  const colors = new Map();
  items.forEach((item) => {
    if (!colors.has(item.group)) colors.set(item.group, DRYDOCK_COLORS[colors.size % DRYDOCK_COLORS.length]);
  });
  return colors;
}

// Error bars: a dataset with `errors` (one standard error per point, aligned with its data) gets a
// vertical bar from y - e to y + e at each point.
const drydockErrorBars = {
  id: "drydockErrorBars",
  afterDatasetsDraw(chart) {
    const ctx = chart.ctx;
    chart.data.datasets.forEach((dataset, i) => {
      if (!dataset.errors || !chart.isDatasetVisible(i)) return;
      const y = chart.scales[dataset.yAxisID || "y"];
      ctx.save();
      ctx.strokeStyle = dataset.borderColor;
      ctx.lineWidth = 1;
      chart.getDatasetMeta(i).data.forEach((point, j) => {
        const value = dataset.data[j] && dataset.data[j].y;
        const error = dataset.errors[j];
        if (value === null || value === undefined || error === null || error === undefined) return;
        const top = y.getPixelForValue(value + error), bottom = y.getPixelForValue(value - error);
        ctx.beginPath();
        ctx.moveTo(point.x, top); ctx.lineTo(point.x, bottom);
        ctx.moveTo(point.x - 4, top); ctx.lineTo(point.x + 4, top);
        ctx.moveTo(point.x - 4, bottom); ctx.lineTo(point.x + 4, bottom);
        ctx.stroke();
      });
      ctx.restore();
    });
  },
};

// Horizontal dashed grey lines for reference levels ({name: value}, e.g. chance accuracy) from
// step `x0` to `x1`, one per distinct value.
function drydockLevels(levels, x0, x1) {
  const values = [...new Set(Object.values(levels || {}))];
  return values.map((value) => ({
    label: values.length > 1 ? `chance (${value.toFixed(3)})` : "chance", data: [{ x: x0, y: value }, { x: x1, y: value }],
    borderColor: "#9e9e9e", backgroundColor: "#9e9e9e", borderWidth: 1.5, borderDash: [6, 4], pointRadius: 0,
  }));
}

// Overlay the training loss (solid) and eval loss (dashed) of every compared run, one colour per
// group (the values of the fields that differ); checkboxes #compare-log and #compare-smooth switch
// a log scale and an exponential moving average of the training loss, as on a step's page.
function drydockCompareChart(canvasId, dataId) {
  const curves = JSON.parse(document.getElementById(dataId).textContent);
  const colors = drydockGroupColors(curves);
  const points = (pairs) => pairs.map((p) => ({ x: p[0], y: p[1] }));
  const smooth = (pairs, alpha) => {
    let last = null;
    return pairs.map((p) => [p[0], p[1] === null ? null : (last = last === null ? p[1] : alpha * p[1] + (1 - alpha) * last)]);
  };
  const base = canvasId.replace(/-chart$/, "");
  const logBox = document.getElementById(base + "-log");
  const smoothBox = document.getElementById(base + "-smooth");
  [logBox, smoothBox].forEach((box) => box && (box.checked = localStorage.getItem("drydock:" + box.id) === "1"));
  const datasets = [];
  const trains = [];
  curves.forEach((curve) => {
    const color = colors.get(curve.group);
    const name = curve.group === curve.step ? `${curve.run} ${curve.step}` : curve.group;
    trains.push([datasets.length, curve.train]);
    datasets.push({ label: name, data: points(curve.train), borderColor: color,
                    backgroundColor: color, borderWidth: 1.5, pointRadius: 0 });
    if (curve.eval.length) {
      datasets.push({ label: name + " (eval)", data: points(curve.eval), borderColor: color,
                      backgroundColor: color, borderWidth: 1.5, borderDash: [5, 4], pointRadius: 3 });
    }
  });
  const chart = drydockLines(canvasId, datasets, "step", "loss");
  // One legend entry per training (its eval curve shares its colour, dashed), below the chart and
  // kept short, so that a ladder's many rows never squash the plot.
  const legend = chart.options.plugins.legend;
  legend.position = "bottom";
  legend.maxHeight = 60;
  legend.labels.boxWidth = 12;
  legend.labels.filter = (item) => !item.text.endsWith(" (eval)");
  const apply = () => {
    chart.options.scales.y.type = logBox && logBox.checked ? "logarithmic" : "linear";
    trains.forEach(([i, pairs]) => {
      chart.data.datasets[i].data = points(smoothBox && smoothBox.checked ? smooth(pairs, 0.1) : pairs);
    });
    chart.update();
  };
  [logBox, smoothBox].forEach((box) => box && box.addEventListener("change", () => {
    localStorage.setItem("drydock:" + box.id, box.checked ? "1" : "0");
    apply();
  }));
  apply();
  return chart;
}

// Curves by checkpoint across runs (each a follower's curve.json with its row's group): one
// colour per group, one dash per series (task or validation set), error bars where the curve
// has standard errors, and its reference levels (chance) as dashed grey lines.
function drydockCheckpointCompare(canvasId, dataId) {
  const curves = JSON.parse(document.getElementById(dataId).textContent);
  const colors = drydockGroupColors(curves);
  const dashes = [[], [6, 3], [2, 2], [8, 3, 2, 3]];
  const names = [...new Set(curves.flatMap((c) => Object.keys(c.series)))];
  const datasets = [];
  let x0 = Infinity, x1 = -Infinity;
  const levels = {};
  curves.forEach((curve) => {
    const color = colors.get(curve.group);
    curve.steps.forEach((x) => { x0 = Math.min(x0, x); x1 = Math.max(x1, x); });
    Object.assign(levels, curve.levels || {});
    Object.entries(curve.series).forEach(([name, values]) => {
      datasets.push({
        label: `${curve.group} ${name}`, data: curve.steps.map((x, j) => ({ x: x, y: values[j] })),
        errors: curve.errors && curve.errors[name], borderColor: color, backgroundColor: color,
        borderWidth: 1.5, pointRadius: 3, borderDash: dashes[names.indexOf(name) % dashes.length],
      });
    });
  });
  datasets.push(...drydockLevels(levels, x0, x1));
  return drydockLines(canvasId, datasets, "training step", curves.length ? curves[0].ylabel : "");
}

// An evaluation's curve by checkpoint (a follower's curve.json): one line per series, with error
// bars and reference levels (chance) where the curve has them.
function drydockCurveChart(canvasId, dataId) {
  const curve = JSON.parse(document.getElementById(dataId).textContent);
  const datasets = Object.entries(curve.series).map(([name, values], i) => ({
    label: name, data: curve.steps.map((x, j) => ({ x: x, y: values[j] })),
    errors: curve.errors && curve.errors[name],
    borderColor: DRYDOCK_COLORS[i % DRYDOCK_COLORS.length], backgroundColor: DRYDOCK_COLORS[i % DRYDOCK_COLORS.length],
    borderWidth: 1.5, pointRadius: 3,
  }));
  datasets.push(...drydockLevels(curve.levels, curve.steps[0], curve.steps[curve.steps.length - 1]));
  return drydockLines(canvasId, datasets, "training step", curve.ylabel);
}

// A line chart of `datasets` ({x, y} points) with linear axes titled `xTitle` and `yTitle`.
function drydockLines(canvasId, datasets, xTitle, yTitle) {
  return new Chart(document.getElementById(canvasId), {
    type: "line",
    data: { datasets: datasets },
    plugins: [drydockErrorBars],
    options: {
      // No animation: the chart is complete as soon as the page has loaded (and so is a screenshot).
      animation: false, parsing: false, normalized: true, maintainAspectRatio: false,
      interaction: { mode: "nearest", axis: "x", intersect: false },
      scales: { x: { type: "linear", title: { display: true, text: xTitle } },
                y: { type: "linear", title: { display: true, text: yTitle } } },
    },
  });
}

// Tokens per second and MFU (second axis) by step, from the loss chart's JSON in #dataId.
function drydockThroughputChart(canvasId, dataId) {
  const series = JSON.parse(document.getElementById(dataId).textContent);
  const points = (ys) => series.steps.map((x, i) => ({ x: x, y: ys[i] })).filter((p) => p.y !== null);
  const datasets = [{
    label: "tokens/s", data: points(series.tokens_per_second), yAxisID: "y",
    borderColor: "#1565c0", backgroundColor: "#1565c0", borderWidth: 1.5, pointRadius: 0,
  }];
  const scales = {
    x: { type: "linear", title: { display: true, text: "step" } },
    y: { type: "linear", position: "left", title: { display: true, text: "tokens/s" } },
  };
  if (series.mfu.some((v) => v !== null)) {
    datasets.push({
      label: "MFU %", data: points(series.mfu), yAxisID: "mfu",
      borderColor: "#ef6c00", backgroundColor: "#ef6c00", borderWidth: 1, pointRadius: 0,
    });
    scales.mfu = { type: "linear", position: "right", grid: { drawOnChartArea: false }, title: { display: true, text: "MFU %" } };
  }
  return new Chart(document.getElementById(canvasId), {
    type: "line", data: { datasets: datasets },
    options: { animation: false, parsing: false, normalized: true, maintainAspectRatio: false, scales: scales },
  });
}

// Expert balance by step (max load ratio, worst layer and mean over layers), where logged.
function drydockRouterChart(canvasId, dataId) {
  const series = JSON.parse(document.getElementById(dataId).textContent);
  const points = (ys) => series.router_steps.map((x, i) => ({ x: x, y: ys[i] })).filter((p) => p.y !== null);
  return drydockLines(canvasId, [
    { label: "worst layer", data: points(series.router_max_load_ratio), borderColor: "#c62828",
      backgroundColor: "#c62828", borderWidth: 1.5, pointRadius: 0 },
    { label: "mean over layers", data: points(series.router_mean_max_load_ratio), borderColor: "#1565c0",
      backgroundColor: "#1565c0", borderWidth: 1.5, pointRadius: 0 },
  ], "step", "max load ratio");
}

// The distribution of seconds per step: a histogram on log-spaced bins.
function drydockStepTimeChart(canvasId, dataId) {
  const t = JSON.parse(document.getElementById(dataId).textContent).step_seconds;
  const fmt = (v) => (v >= 10 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toPrecision(2));
  const labels = t.counts.map((_, i) => `${fmt(t.edges[i])}-${fmt(t.edges[i + 1])} s`);
  return new Chart(document.getElementById(canvasId), {
    type: "bar",
    data: { labels: labels, datasets: [{ label: "steps", data: t.counts, backgroundColor: "#1565c0" }] },
    options: {
      animation: false, maintainAspectRatio: false,
      scales: { x: { title: { display: true, text: "seconds per step" } }, y: { title: { display: true, text: "steps" } } },
      plugins: { legend: { display: false } },
    },
  });
}
