// aiptrain's console: a page that reads only this server's REST API (ml v1 projects.jobs, logging
// v2 entries:list, and aiplatform v1 customJobs and hyperparameterTuningJobs for the Vertex AI jobs
// among them) with the caller's token. No build step, no library: the DOM, fetch and chart.js
// (inline SVG). Untrusted text (log lines, labels, messages) goes in as textContent.
"use strict";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const STATE_ICONS = {
  QUEUED: "\u23F3", PREPARING: "\u25D4", RUNNING: "\u25B6", SUCCEEDED: "\u2714", FAILED: "\u2716",
  CANCELLING: "\u25CC", CANCELLED: "\u2298", STATE_UNSPECIFIED: "?",
};
const SEVERITIES = ["DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"];
const REFRESH_MS = 3000;
const LOG_POLL_MS = 1000;
const LOG_PAGE = 500;          // entries fetched per request
const LOG_MAX_ROWS = 5000;     // rows kept in the page; older ones are dropped (Load earlier brings them back)
// The ml v1 job that runs a Vertex AI job is named by its kind and numeric ID (aiptrain.vertex.records).
const VERTEX_JOB = /^(custom_job|hp_tuning_job)_(\d+)$/;
const VERTEX_KINDS = {custom_job: "customJobs", hp_tuning_job: "hyperparameterTuningJobs"};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// -- the API ----------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

const api = {
  token: localStorage.getItem("aiptrain.token") || "",
  declined: false,  // the token dialog was closed without a token: auto-refresh does not reopen it

  async call(method, path, body) {
    const headers = {};
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
    } catch (error) {
      throw new ApiError(0, `The server cannot be reached (${error.message}).`);
    }
    let answer = {};
    try { answer = await response.json(); } catch (error) { /* an empty or non-JSON answer */ }
    if (!response.ok) {
      const message = (answer.error && answer.error.message) || `HTTP ${response.status}`;
      if (response.status === 401 && !this.declined) askForToken(message);
      throw new ApiError(response.status, message);
    }
    return answer;
  },

  jobs(project) { return `/v1/projects/${encodeURIComponent(project)}/jobs`; },
  list(project, params) {
    const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== undefined));
    return this.call("GET", `${this.jobs(project)}?${query}`);
  },
  get(project, jobId) { return this.call("GET", `${this.jobs(project)}/${encodeURIComponent(jobId)}`); },
  cancel(project, jobId) { return this.call("POST", `${this.jobs(project)}/${encodeURIComponent(jobId)}:cancel`, {}); },
  tensorboard(project, jobId) {
    return this.call("POST", `${this.jobs(project)}/${encodeURIComponent(jobId)}:tensorboard`, {});
  },
  entries(body) { return this.call("POST", "/v2/entries:list", body); },
  // A Vertex AI job of the project, in any location (`-`), by kind and numeric ID.
  vertexJob(project, kind, id) {
    return this.call("GET", `/v1/projects/${encodeURIComponent(project)}/locations/-/${kind}/${id}`);
  },
};

// -- Vertex AI jobs ------------------------------------------------------------------------------
// A Vertex AI job is run by an ml v1 job (custom_job_ID, hp_tuning_job_ID), which the jobs list
// returns with the others; its displayName and resource name come from aiplatform v1's get. Both
// are fixed once the job exists, so each is asked for once per page load. A job whose get fails
// (none recorded, or its kind not served) is shown as the ml v1 job it is.

const vertex = {
  found: new Map(),  // "project/jobId" -> the Vertex AI resource, or null when there is none

  key(jobId) { return `${state.project}/${jobId}`; },

  of(jobId) { return this.found.get(this.key(jobId)) || null; },

  // Ask for the Vertex AI resources of these jobs not asked for yet; true when any arrived.
  async load(jobIds) {
    const asked = jobIds.filter((jobId) => VERTEX_JOB.test(jobId) && !this.found.has(this.key(jobId)));
    const answers = await Promise.all(asked.map(async (jobId) => {
      const [, kind, id] = jobId.match(VERTEX_JOB);
      const key = this.key(jobId);
      try {
        this.found.set(key, await api.vertexJob(state.project, VERTEX_KINDS[kind], id));
        return true;
      } catch (error) {
        if (error.code !== 401) this.found.set(key, null);  // 401: asked again once there is a token
        return false;
      }
    }));
    return answers.some(Boolean);
  },
};

function vertexMarker(resource) {
  return el("span", {class: "chip vertex", text: "Vertex AI", title: resource.name});
}

function askForToken(message) {
  const dialog = $("token-dialog");
  if (dialog.open) return;
  $("token-error").hidden = !message;
  $("token-error").textContent = message || "";
  $("token-input").value = "";
  dialog.showModal();
}

function setUpToken() {
  $("token-button").addEventListener("click", () => askForToken(""));
  $("token-dialog").addEventListener("close", () => {
    api.declined = $("token-dialog").returnValue !== "save";
    if (api.declined) return;
    api.token = $("token-input").value.trim();
    if (api.token) localStorage.setItem("aiptrain.token", api.token);
    else localStorage.removeItem("aiptrain.token");
    route();
  });
}

// -- formatting -------------------------------------------------------------------------------

function stateBadge(state) {
  state = state || "STATE_UNSPECIFIED";
  return el("span", {class: `state state-${state.toLowerCase()}`, title: state, "data-state": state},
    el("span", {class: "icon", "aria-hidden": "true", text: STATE_ICONS[state] || "?"}), ` ${state}`);
}

function when(text) {
  if (!text) return "";
  const date = new Date(text);
  return isNaN(date) ? text : date.toLocaleString(undefined, {dateStyle: "medium", timeStyle: "medium"});
}

function durationMs(job) {
  const start = Date.parse(job.startTime || job.createTime);
  if (isNaN(start)) return null;
  const end = job.endTime ? Date.parse(job.endTime) : (TERMINAL.has(job.state) ? start : Date.now());
  return Math.max(0, end - start);
}

function duration(ms) {
  if (ms === null) return "";
  let seconds = Math.round(ms / 1000);
  const hours = Math.floor(seconds / 3600), minutes = Math.floor((seconds % 3600) / 60);
  seconds %= 60;
  return hours ? `${hours} h ${minutes} min` : minutes ? `${minutes} min ${seconds} s` : `${seconds} s`;
}

// An objective as people read it: 0.39499999999999996 as 0.395 (the exact value is in the cell's title).
function number(value) {
  return typeof value === "number" ? String(+value.toPrecision(6)) : "";
}

function labelChips(labels) {
  return el("span", {class: "labels"},
    ...Object.entries(labels || {}).map(([key, value]) => el("span", {class: "chip", text: `${key}: ${value}`})));
}

function showError(id, error) {
  const node = $(id);
  node.hidden = !error;
  node.textContent = error ? error.message : "";
}

// -- confirmation and cancel --------------------------------------------------------------------

function confirmCancel(jobId) {
  return new Promise((resolve) => {
    const dialog = $("confirm-dialog");
    $("confirm-text").textContent = `Cancel job ${jobId}? Its replicas are stopped; this cannot be undone.`;
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), {once: true});
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function cancelJob(jobId, onError) {
  if (!(await confirmCancel(jobId))) return false;
  try {
    await api.cancel(state.project, jobId);
    return true;
  } catch (error) {
    onError(error);
    return false;
  }
}

// -- the jobs page ------------------------------------------------------------------------------

const state = {project: "", timer: null, view: null};

const jobsPage = {
  tokens: [""],      // page tokens of the pages seen: tokens[i] opens page i
  page: 0,
  next: "",
  jobs: [],
  sortKey: "", sortDown: false,

  open(params) {
    $("filter").value = params.get("filter") || "";
    this.tokens = [""]; this.page = 0;
    this.load();
  },

  async load() {
    try {
      const answer = await api.list(state.project, {
        filter: $("filter").value.trim(), pageSize: $("page-size").value, pageToken: this.tokens[this.page]});
      this.jobs = answer.jobs || [];
      this.next = answer.nextPageToken || "";
      showError("jobs-error", null);
    } catch (error) {
      showError("jobs-error", error);
      this.jobs = []; this.next = "";
    }
    this.render();
    if (await vertex.load(this.jobs.map((job) => job.jobId))) this.render();
  },

  sorted() {
    if (!this.sortKey) return this.jobs;
    const key = this.sortKey === "duration" ? (job) => durationMs(job) ?? -1 : (job) => job[this.sortKey] || "";
    const order = this.sortDown ? -1 : 1;
    return [...this.jobs].sort((a, b) => (key(a) < key(b) ? -order : key(a) > key(b) ? order : 0));
  },

  render() {
    const rows = this.sorted().map((job) => {
      const resource = vertex.of(job.jobId);
      const link = el("a", {href: `#/jobs/${encodeURIComponent(job.jobId)}`,
        text: resource ? resource.displayName || job.jobId : job.jobId, title: job.jobId});
      const cancel = TERMINAL.has(job.state) || job.state === "CANCELLING" ? "" :
        el("button", {type: "button", class: "danger small", text: "Cancel", onclick: async () => {
          if (await cancelJob(job.jobId, (error) => showError("jobs-error", error))) this.load();
        }});
      return el("tr", {"data-job": job.jobId},
        el("td", {class: "id"}, link, resource ? vertexMarker(resource) : ""), el("td", {}, stateBadge(job.state)),
        el("td", {text: when(job.createTime)}), el("td", {text: duration(durationMs(job))}),
        el("td", {}, labelChips(job.labels)), el("td", {}, cancel));
    });
    $("jobs-body").replaceChildren(...rows);
    $("jobs-empty").hidden = rows.length > 0;
    $("prev-page").disabled = this.page === 0;
    $("next-page").disabled = !this.next;
    $("page-label").textContent = `Page ${this.page + 1}`;
    for (const th of document.querySelectorAll("#jobs-table th[data-sort]")) {
      th.classList.toggle("sorted", th.dataset.sort === this.sortKey);
      th.classList.toggle("down", th.dataset.sort === this.sortKey && this.sortDown);
    }
  },

  refresh() {
    if ($("auto-refresh").checked && !document.hidden && !$("confirm-dialog").open) this.load();
  },

  setUp() {
    $("filter-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const filter = $("filter").value.trim();
      const target = filter ? `#/?filter=${encodeURIComponent(filter)}` : "#/";
      if (location.hash === target) this.open(new URLSearchParams(filter ? {filter} : {}));
      else location.hash = target;
    });
    $("next-page").addEventListener("click", () => {
      this.tokens[this.page + 1] = this.next; this.page += 1; this.load();
    });
    $("prev-page").addEventListener("click", () => { this.page = Math.max(0, this.page - 1); this.load(); });
    $("page-size").addEventListener("change", () => { this.tokens = [""]; this.page = 0; this.load(); });
    for (const th of document.querySelectorAll("#jobs-table th[data-sort]")) {
      th.addEventListener("click", () => {
        this.sortDown = this.sortKey === th.dataset.sort ? !this.sortDown : th.dataset.sort === "createTime";
        this.sortKey = th.dataset.sort;
        this.render();
      });
    }
  },
};

// -- the job page -------------------------------------------------------------------------------

const jobPage = {
  jobId: "",
  job: null,

  open(jobId) {
    this.jobId = jobId;
    this.job = null;
    $("job-title").textContent = jobId;
    $("job-kind").replaceChildren();
    $("job-state").replaceChildren();
    $("tuning").hidden = true;
    $("tensorboard-link").hidden = true;
    this.tensorboardOpen = false;
    logs.start(jobId);
    this.load();
  },

  async load() {
    try {
      this.job = await api.get(state.project, this.jobId);
      showError("job-error", null);
    } catch (error) {
      showError("job-error", error);
      return;
    }
    await vertex.load([this.jobId]);
    this.render(this.job);
  },

  refresh() {
    if (!this.job || !TERMINAL.has(this.job.state)) this.load();
  },

  render(job) {
    const resource = vertex.of(job.jobId);
    $("job-title").textContent = resource ? resource.displayName || job.jobId : job.jobId;
    $("job-kind").replaceChildren(resource ? vertexMarker(resource) : "");
    $("job-state").replaceChildren(stateBadge(job.state));
    $("job-cancel").hidden = TERMINAL.has(job.state) || job.state === "CANCELLING";
    $("tensorboard-button").hidden = !(job.trainingInput && job.trainingInput.jobDir);
    $("job-message").hidden = !job.errorMessage;
    $("job-message").textContent = job.errorMessage || "";
    const input = job.trainingInput || {};
    details("job-details", [
      ["Vertex AI resource", resource && resource.name], ["Runs as ml v1 job", resource && job.jobId],
      ["Created", when(job.createTime)], ["Started", when(job.startTime)], ["Ended", when(job.endTime)],
      ["Duration", duration(durationMs(job))], ["Labels", labelChips(job.labels)],
      ["Position in queue", job.jobPosition], ["Region", input.region],
      ["Runtime version", input.runtimeVersion], ["Python version", input.pythonVersion],
      ["Python module", input.pythonModule], ["Packages", list(input.packageUris)],
      ["Arguments", (input.args || []).join(" ")], ["Job directory", input.jobDir],
      ["Image", input.masterConfig && input.masterConfig.imageUri],
      ["ML units", job.trainingOutput && job.trainingOutput.consumedMLUnits],
    ]);
    details("job-scale", [
      ["Scale tier", input.scaleTier || "BASIC"],
      ["Master", replicas(1, input.masterType, input.masterConfig)],
      ["Workers", replicas(input.workerCount, input.workerType, input.workerConfig)],
      ["Parameter servers", replicas(input.parameterServerCount, input.parameterServerType,
        input.parameterServerConfig)],
      ["Evaluators", replicas(input.evaluatorCount, input.evaluatorType, input.evaluatorConfig)],
      ["Tasks in the log", logs.tasks.size ? [...logs.tasks].sort().join(", ") : ""],
    ]);
    $("job-json").textContent = JSON.stringify(job, null, 2);
    if (input.hyperparameters) tuning.render(job);
  },

  // TensorBoard on the job's output, started by the server; asked again every minute while this
  // page shows the job, since the server stops a TensorBoard nobody asked for in 10 minutes.
  async tensorboard() {
    const button = $("tensorboard-button");
    button.disabled = true;
    button.textContent = "Starting TensorBoard…";
    try {
      const answer = await api.tensorboard(state.project, this.jobId);
      $("tensorboard-link").href = answer.url;
      $("tensorboard-link").title = `TensorBoard on ${answer.logdir}`;
      $("tensorboard-link").hidden = false;
      this.tensorboardOpen = true;
      showError("job-error", null);
    } catch (error) {
      showError("job-error", error);
    } finally {
      button.disabled = false;
      button.textContent = "TensorBoard";
    }
  },

  setUp() {
    $("job-cancel").addEventListener("click", async () => {
      if (await cancelJob(this.jobId, (error) => showError("job-error", error))) this.load();
    });
    $("tensorboard-button").addEventListener("click", () => this.tensorboard());
    setInterval(() => {
      if (state.view === "job" && this.tensorboardOpen) api.tensorboard(state.project, this.jobId).catch(() => {});
    }, 60000);
  },
};

function replicas(count, type, config) {
  count = Number(count || 0);
  if (!count) return "";
  const accelerator = config && config.acceleratorConfig;
  const gpus = accelerator && accelerator.count ? `, ${accelerator.count} \u00D7 ${accelerator.type}` : "";
  return `${count} \u00D7 ${type || "standard"}${gpus}`;
}

function list(values) {
  return values && values.length ? el("span", {class: "list"}, ...values.map((v) => el("div", {text: v}))) : "";
}

function details(id, rows) {
  const items = [];
  for (const [name, value] of rows) {
    if (value === undefined || value === null || value === "") continue;
    if (value instanceof Node && !value.childNodes.length) continue;
    items.push(el("dt", {text: name}), el("dd", {}, value instanceof Node ? value : String(value)));
  }
  $(id).replaceChildren(...items);
}

// -- the trials of a tuning job --------------------------------------------------------------------

const tuning = {
  render(job) {
    const spec = job.trainingInput.hyperparameters;
    const output = job.trainingOutput || {};
    const trials = [...(output.trials || [])].sort((a, b) => Number(a.trialId) - Number(b.trialId));
    const maximize = spec.goal !== "MINIMIZE";
    const objective = (trial) => trial.finalMetric && trial.finalMetric.objectiveValue;
    const scored = trials.filter((trial) => typeof objective(trial) === "number");
    const best = scored.reduce((b, t) => (!b || (maximize ? objective(t) > objective(b) : objective(t) < objective(b))
      ? t : b), null);
    $("tuning").hidden = false;
    $("tuning-summary").textContent = `${output.completedTrialCount || 0} of ${spec.maxTrials || "?"} trials done, `
      + `${maximize ? "maximizing" : "minimizing"} ${output.hyperparameterMetricTag || spec.hyperparameterMetricTag
        || "the metric"}${best ? `; best: trial ${best.trialId} (${number(objective(best))})` : ""}`;

    const names = (spec.params || []).map((p) => p.parameterName);
    const head = el("tr", {}, ...["Trial", "State", ...names, "Objective", "Step", "Ended"].map(
      (name) => el("th", {text: name})));
    const rows = trials.map((trial) => el("tr", {class: trial === best ? "best" : "", "data-trial": trial.trialId},
      el("td", {text: trial.trialId}), el("td", {}, stateBadge(trial.state)),
      ...names.map((name) => el("td", {text: (trial.hyperparameters || {})[name] ?? ""})),
      el("td", {text: number(objective(trial)), title: String(objective(trial) ?? "")}),
      el("td", {text: (trial.finalMetric && trial.finalMetric.trainingStep) || ""}),
      el("td", {text: when(trial.endTime)})));
    $("trials-table").tHead.replaceChildren(head);
    $("trials-table").tBodies[0].replaceChildren(...rows);

    const points = scored.map((trial) => ({id: trial.trialId, value: objective(trial), trial}));
    $("chart-trials").replaceChildren(chart.objectivePerTrial(points, maximize));
    const select = $("chart-param");
    if (select.options.length !== names.length) {
      select.replaceChildren(...names.map((name) => el("option", {value: name, text: name})));
    }
    const param = (spec.params || []).find((p) => p.parameterName === select.value);
    $("chart-param-plot").replaceChildren(param ? chart.parameterAgainstObjective(points, param) : "");
  },

  setUp() {
    $("chart-param").addEventListener("change", () => jobPage.job && this.render(jobPage.job));
  },
};

// -- live logs ----------------------------------------------------------------------------------------
// The newest LOG_PAGE entries first (orderBy desc), then a poll every second for what comes after
// the last entry seen, with the lower bound gcloud's log fetcher uses:
// ((timestamp="T" AND insertId>"I") OR timestamp>"T"). insertId is stable, so nothing repeats.

const logs = {
  jobId: "", generation: 0, first: null, last: null, tasks: new Set(), busy: false, olderLeft: false,
  complete: false,  // the job had ended before a poll that found nothing new: its log is whole
  notBefore: 0,     // the next poll's earliest time: a server slow to answer (a huge log) is asked less often

  filter() {
    let text = `resource.type="ml_job" AND resource.labels.job_id="${this.jobId}"`;
    const task = $("log-task").value, severity = $("log-severity").value;
    if (task) text += ` AND resource.labels.task_name="${task.replace(/["\\]/g, "")}"`;
    if (severity) {
      const allowed = SEVERITIES.slice(SEVERITIES.indexOf(severity));
      text += ` AND (${allowed.map((s) => `severity="${s}"`).join(" OR ")})`;
    }
    return text;
  },

  start(jobId) {
    this.jobId = jobId;
    this.generation += 1;
    this.first = this.last = null;
    this.olderLeft = false;
    this.complete = false;
    $("log").replaceChildren();
    $("log-earlier").hidden = true;
    $("log-follow").checked = true;
    this.tail();
  },

  body(filter, descending, pageSize = LOG_PAGE) {
    return {resourceNames: [`projects/${state.project}`], filter, pageSize,
      orderBy: descending ? "timestamp desc" : "timestamp asc"};
  },

  async tail() {
    const generation = this.generation;
    this.busy = true;
    try {
      const answer = await api.entries(this.body(this.filter(), true));
      if (generation !== this.generation) return;
      const entries = (answer.entries || []).reverse();
      this.olderLeft = Boolean(answer.nextPageToken);
      if (entries.length) this.first = entries[0];
      this.append(entries);
      $("log-status").textContent = "";
    } catch (error) {
      $("log-status").textContent = error.message;
    } finally {
      if (generation === this.generation) this.busy = false;
    }
  },

  async poll() {
    if (this.busy || !this.jobId || this.complete || document.hidden || Date.now() < this.notBefore) return;
    if (!$("log-follow").checked) return;  // reading earlier lines: hold still
    const generation = this.generation;
    const ended = Boolean(jobPage.job && TERMINAL.has(jobPage.job.state));
    const began = Date.now();
    this.busy = true;
    try {
      for (let page = 0; page < 10; page += 1) {  // catch up at most 10 pages a second
        let filter = this.filter();
        if (this.last) {
          const {timestamp, insertId} = this.last;
          filter += ` AND ((timestamp="${timestamp}" AND insertId>"${insertId}") OR timestamp>"${timestamp}")`;
        }
        const answer = await api.entries(this.body(filter, false));
        if (generation !== this.generation) return;
        this.append(answer.entries || []);
        if (ended && !(answer.entries || []).length) this.complete = true;
        if (!answer.nextPageToken) break;
      }
      $("log-status").textContent = "";
    } catch (error) {
      $("log-status").textContent = error.message;
    } finally {
      if (generation === this.generation) this.busy = false;
      this.notBefore = Date.now() + 2 * (Date.now() - began);
    }
  },

  async earlier() {
    if (!this.first) return;
    const {timestamp, insertId} = this.first;
    const filter = `${this.filter()} AND ((timestamp="${timestamp}" AND insertId<"${insertId}") OR `
      + `timestamp<"${timestamp}")`;
    $("log-follow").checked = false;
    const generation = this.generation;
    let answer;
    try {
      answer = await api.entries(this.body(filter, true));
    } catch (error) {
      $("log-status").textContent = error.message;
      return;
    }
    if (generation !== this.generation) return;
    const entries = (answer.entries || []).reverse();
    this.olderLeft = Boolean(answer.nextPageToken);
    if (entries.length) {
      this.first = entries[0];
      const log = $("log"), height = log.scrollHeight;
      log.prepend(...entries.map((entry) => this.row(entry)));
      log.scrollTop += log.scrollHeight - height;
      while (log.childElementCount > LOG_MAX_ROWS) log.lastElementChild.remove();
      this.last = null;  // the newest rows were dropped: Follow starts again from the end
    }
    $("log-earlier").hidden = !this.olderLeft;
  },

  row(entry) {
    const labels = entry.resource && entry.resource.labels || {};
    const severity = entry.severity || "DEFAULT";
    const trial = entry.labels && entry.labels["ml.googleapis.com/trial_id"];
    const time = entry.timestamp ? entry.timestamp.replace("T", " ").replace(/\.(\d{3})\d*Z$/, ".$1") : "";
    const row = el("div", {class: `line sev-${severity.toLowerCase()}`},
      el("span", {class: "time", text: time}), el("span", {class: "sev", text: severity}),
      el("span", {class: "task", text: labels.task_name || ""}),
      trial ? el("span", {class: "trial", text: `trial ${trial}`}) : "",
      el("span", {class: "msg", text: (entry.jsonPayload && entry.jsonPayload.message) || entry.textPayload || ""}));
    row.entry = entry;  // the first row's entry is where Load earlier continues from
    return row;
  },

  append(entries) {
    if (!entries.length) return;
    const log = $("log");
    const fragment = document.createDocumentFragment();
    let newTask = false;
    for (const entry of entries) {
      fragment.append(this.row(entry));
      const task = entry.resource && entry.resource.labels && entry.resource.labels.task_name;
      if (task && !this.tasks.has(task)) { this.tasks.add(task); newTask = true; }
    }
    log.append(fragment);
    this.last = entries[entries.length - 1];
    let dropped = 0;
    while (log.childElementCount > LOG_MAX_ROWS) { log.firstElementChild.remove(); dropped += 1; }
    if (dropped) { this.olderLeft = true; this.first = log.firstElementChild.entry; }
    $("log-earlier").hidden = !this.olderLeft || !this.first;
    if ($("log-follow").checked) log.scrollTop = log.scrollHeight;
    if (newTask) this.renderTasks();
  },

  renderTasks() {
    const select = $("log-task"), chosen = select.value;
    select.replaceChildren(el("option", {value: "", text: "All tasks"}),
      ...[...this.tasks].sort().map((task) => el("option", {value: task, text: task})));
    select.value = chosen;
  },

  setUp() {
    $("log-severity").addEventListener("change", () => this.start(this.jobId));
    $("log-task").addEventListener("change", () => this.start(this.jobId));
    $("log-earlier").addEventListener("click", () => this.earlier());
    $("log-follow").addEventListener("change", () => {
      if ($("log-follow").checked && !this.last) this.start(this.jobId);
      else if ($("log-follow").checked) $("log").scrollTop = $("log").scrollHeight;
    });
    $("log").addEventListener("scroll", () => {
      const log = $("log");
      const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
      if (!atEnd && $("log-follow").checked && log.matches(":hover, :focus-within")) $("log-follow").checked = false;
    });
    setInterval(() => state.view === "job" && this.poll(), LOG_POLL_MS);
  },
};

// -- routing ----------------------------------------------------------------------------------------
// #/ and #/?filter=...: the jobs; #/jobs/JOB: one job. The project is kept in localStorage.

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const match = path.match(/^\/jobs\/([^/]+)$/);
  state.view = match ? "job" : "jobs";
  $("jobs-view").hidden = state.view !== "jobs";
  $("job-view").hidden = state.view !== "job";
  if (match) {
    document.title = `${decodeURIComponent(match[1])} \u2013 aiptrain`;
    logs.tasks = new Set();
    logs.renderTasks();
    jobPage.open(decodeURIComponent(match[1]));
  } else {
    document.title = "Jobs \u2013 aiptrain";
    logs.jobId = "";
    jobsPage.open(new URLSearchParams(query || ""));
  }
}

function start() {
  const fallback = document.querySelector('meta[name="aiptrain-default-project"]').content;
  state.project = localStorage.getItem("aiptrain.project") || fallback;
  $("project").value = state.project;
  $("project").addEventListener("change", () => {
    state.project = $("project").value.trim() || fallback;
    $("project").value = state.project;
    localStorage.setItem("aiptrain.project", state.project);
    route();
  });
  setUpToken();
  jobsPage.setUp();
  jobPage.setUp();
  tuning.setUp();
  logs.setUp();
  window.addEventListener("hashchange", route);
  setInterval(() => (state.view === "jobs" ? jobsPage.refresh() : jobPage.refresh()), REFRESH_MS);
  route();
}

document.addEventListener("DOMContentLoaded", start);
