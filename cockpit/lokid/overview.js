/*
 * The overview: every preset lokid.service serves (and each broken one with
 * its reason) with its state, model, URL, uptime, requests per minute,
 * prefill and decode speed, draft acceptance, GPU memory, the speculation its
 * engine uses and why, its on-demand state and a pending restart; Start and
 * Stop call the daemon's StartPreset and StopPreset; a preset's name opens its
 * own view.
 *
 * Everything shown is a documented D-Bus fact (data/dbus/org.lokid.Lokid1.xml),
 * followed through PropertiesChanged and the Manager's signals
 * (EngineStateChanged, JobFinished); nothing polls.
 */
"use strict";

(function () {
    const { manager, $, el, unwrap, act, RUNNING } = lokid;
    const COLUMNS = ["name", "state", "url", "uptime", "rpm", "speed", "draft", "memory",
        "spec", "ondemand", "actions"];
    const TICK_MS = 10000;      // uptimes move on screen without the daemon saying so
    const rows = {};            // preset name -> its row's elements
    const details = {};         // preset name -> the last EngineStateChanged {state, detail}

    function number(x, digits) {
        return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "";
    }

    function duration(seconds) {
        if (typeof seconds !== "number" || !isFinite(seconds))
            return "";
        const s = Math.floor(seconds);
        if (s < 60)
            return s + " s";
        if (s < 3600)
            return Math.floor(s / 60) + " min";
        if (s < 86400)
            return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
        return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
    }

    // Stats' a{sv} as plain values, one level down too (prefill_tps, draft, ...).
    function stats(p) {
        const out = {};
        for (const [key, value] of Object.entries((p && p.Stats) || {})) {
            const v = unwrap(value);
            if (v && typeof v === "object" && !Array.isArray(v)) {
                out[key] = {};
                for (const [k, x] of Object.entries(v))
                    out[key][k] = unwrap(x);
            } else {
                out[key] = v;
            }
        }
        return out;
    }

    function memory(s) {
        const parts = Object.entries(s.memory_mib || {}).map(([where, mib]) =>
            where + " " + number(mib / 1024, 1) + " GiB");
        return parts.join(", ") || s.memory_note || "";
    }

    function newRow(name) {
        const tr = el("tr");
        tr.dataset.preset = name;
        const cells = {};
        for (const key of COLUMNS) {
            cells[key] = el("td", "lk-cell-" + key);
            tr.appendChild(cells[key]);
        }
        const link = el("a", "lk-name", name);
        link.href = "#/preset/" + encodeURIComponent(name);
        link.addEventListener("click", ev => {
            ev.preventDefault();
            cockpit.location.go(["preset", name]);
        });
        cells.name.appendChild(link);
        cells.model = el("div", "lk-muted lk-small lk-model");
        cells.pending = el("span", "lk-label lk-label-warning", "restart pending");
        cells.pending.title = "The engine runs an older command line than the preset's file asks for";
        cells.name.append(cells.pending, cells.model);
        cells.badge = el("span", "lk-state");
        cells.detail = el("div", "lk-muted lk-small");
        cells.state.append(cells.badge, cells.detail);
        cells.start = el("button", "lk-btn lk-btn-secondary", "Start");
        cells.stop = el("button", "lk-btn lk-btn-secondary", "Stop");
        cells.start.type = cells.stop.type = "button";
        cells.start.addEventListener("click", () => act("StartPreset", [name], cells.start));
        cells.stop.addEventListener("click", () => act("StopPreset", [name], cells.stop));
        cells.actions.append(cells.start, cells.stop);
        const err = el("tr", "lk-error-row");
        cells.error = el("td", "lk-error");
        cells.error.colSpan = COLUMNS.length;
        err.appendChild(cells.error);
        return { tr, err, cells };
    }

    function fill(row, name, p, broken) {
        const c = row.cells;
        // external, broken (a file that cannot be read, or a preset that cannot start as
        // it is: Start would fail for the reason under the row), else the engine's state
        const kind = lokid.kindOf(name, p);
        const external = kind === "external";
        const state = kind === "engine" ? p.State : kind === "gone" ? "broken" : kind;
        c.badge.textContent = state;
        c.badge.className = "lk-state lk-state-" + state;
        // The signal's detail says why a run ended (a job result, an exit status);
        // while one loads or serves, the supervisor's Status line is the live word (the
        // detail of "ready" was still the last line of loading: seen in the walk).
        const last = details[name];
        const ended = last && last.state === state && !["loading", "ready"].includes(state);
        c.detail.textContent = ended ? last.detail : (p ? p.Status : "");
        c.pending.hidden = !(p && p.PendingRestart);
        const s = stats(p);
        const running = RUNNING.includes(state);
        c.model.textContent = p ? (external ? p.UpstreamModel : p.Model) : "";
        c.url.textContent = p ? (external ? p.Url : s.url || "") : "";
        // From the start's own time: Stats only changes when the engine logs something.
        c.uptime.textContent = running && typeof s.started === "number"
            ? duration(Date.now() / 1000 - s.started) : "";
        c.rpm.textContent = running ? number(s.requests_per_min, 1) : "";
        const prefill = (s.prefill_tps || {})["1m"];
        const decode = (s.decode_tps || {})["1m"];
        c.speed.textContent = running && (prefill !== undefined || decode !== undefined)
            ? number(prefill, 0) + " / " + number(decode, 1) : "";
        const acceptance = (s.draft || {}).acceptance;
        c.draft.textContent = running && acceptance !== undefined
            ? number(100 * acceptance, 0) + " %" : "";
        c.memory.textContent = running ? memory(s) : "";
        if (p) {
            const active = p.SpecActive || [];
            // Why: the configured mode, and a recorded failure that cut auto.
            const why = ["mode " + (p.SpecMode || "off")];
            if (p.AutoSpecBlocked)
                why.push(p.AutoSpecBlocked);
            c.spec.replaceChildren(el("span", "", active.length ? active.join(", ") : "none"),
                                   el("div", "lk-muted lk-small", why.join(": ")));
        } else {
            c.spec.replaceChildren();
        }
        c.ondemand.textContent = p && p.OnDemandState ? p.OnDemandState : "";
        // the one verb that applies: the column stays narrow enough for a laptop
        c.start.hidden = kind !== "engine" || running;
        c.stop.hidden = kind !== "engine" || !running;
        c.error.textContent = broken || "";
        row.err.hidden = !broken;
    }

    function render() {
        if ($("lk-overview").hidden)
            return;
        if (!manager.valid) {
            $("lk-table").hidden = true;
            $("lk-status").hidden = false;
            $("lk-status").textContent = "lokid.service does not answer on the system bus.";
            return;
        }
        $("lk-version").textContent = "lokid " + manager.Version;
        const broken = manager.BrokenPresets || {};
        const byName = lokid.presets();
        // A preset file that cannot be read has no object: its row is its error.
        const names = Array.from(new Set(Object.keys(byName).concat(Object.keys(broken)))).sort();
        const body = $("lk-presets");
        for (const name of Object.keys(rows)) {
            if (!names.includes(name)) {
                rows[name].tr.remove();
                rows[name].err.remove();
                delete rows[name];
            }
        }
        for (const name of names) {
            if (!rows[name])
                rows[name] = newRow(name);
            fill(rows[name], name, byName[name], broken[name]);
            body.append(rows[name].tr, rows[name].err);   // moves it into name order
        }
        // the first paint with every preset the daemon has: a mark the browser test reads
        if (names.length && Object.keys(byName).length === (manager.Presets || []).length &&
                !performance.getEntriesByName("lokid-overview").length)
            performance.mark("lokid-overview", { detail: names.length });
        $("lk-table").hidden = names.length === 0;
        $("lk-status").hidden = names.length !== 0;
        $("lk-status").textContent = "No presets: lokid reads them from /etc/loki/presets/NAME.toml.";
    }

    manager.addEventListener("EngineStateChanged", (event, name, state, detail) => {
        details[name] = { state, detail };
        lokid.changed();
    });
    manager.addEventListener("JobFinished", (event, name, job, verb, result, state, detail) => {
        if (result !== "done")
            lokid.showError(verb + " " + name + ": " + result + ".", detail);
    });
    function tick() {
        render();
        window.setTimeout(tick, TICK_MS);
    }

    lokid.onChange(render);
    window.setTimeout(tick, TICK_MS);
    lokid.renderOverview = render;
    lokid.stats = stats;
    lokid.duration = duration;
    lokid.number = number;
}());
