/*
 * One preset's view (#/preset/NAME): its state with Start, Stop and Restart,
 * then one card per section of lokid.sections in their order, each shown for
 * the kinds of preset it applies to (lokid.kindOf). Five sections are here:
 * the plan (the engine's command line and each note saying why, from the
 * Argv, Notes and RunningArgv properties and Plan()), its engines (Replicas:
 * each replica's unit, state, port and requests in flight), the last minutes of its
 * Stats as small charts (a bounded window, sampled as PropertiesChanged brings
 * them), the recorded failures of automatic speculation with Clear
 * (ClearFailures), and, for an external preset, what it is (Url,
 * UpstreamModel, KeyFile, Reachable).
 *
 * An external preset runs nothing here: its header says "external" and has no
 * verbs (the daemon refuses them), and the engine's cards are not shown. A
 * broken preset (BrokenPresets, not running) says "broken" and why, without
 * Start: the start would fail for that very reason; its file can be fixed in
 * the Edit card.
 */
"use strict";

(function () {
    const { $, el, act, RUNNING } = lokid;
    const WINDOW_SECONDS = 600;         // the charts' window: the last ten minutes
    let view = null;                    // {name, mounted: [{update, unmount}]}

    function proxyOf(name) {
        return lokid.presets()[name] || null;
    }

    // --- the header: state and the verbs ---------------------------------------

    function header(name) {
        const box = $("lk-preset-head");
        box.replaceChildren();
        const back = el("a", "lk-back", "All presets");
        back.href = "#/";
        back.addEventListener("click", ev => {
            ev.preventDefault();
            cockpit.location.go([]);
        });
        const title = el("h2", "lk-preset-title", name);
        title.id = "lk-preset-name";
        const badge = el("span", "lk-state");
        const detail = el("span", "lk-muted");
        const buttons = {};
        const verbs = el("span", "lk-actions");
        for (const [label, verb] of [["Start", "StartPreset"], ["Stop", "StopPreset"],
            ["Restart", "RestartPreset"]]) {
            const b = el("button", "lk-btn lk-btn-secondary", label);
            b.type = "button";
            b.id = "lk-preset-" + label.toLowerCase();
            b.addEventListener("click", () => act(verb, [name], b));
            buttons[label] = b;
            verbs.appendChild(b);
        }
        box.append(back, el("div", "lk-title-line", undefined));
        box.lastChild.append(title, badge, verbs);
        box.append(detail);
        return {
            update() {
                const p = proxyOf(name);
                const broken = (lokid.manager.BrokenPresets || {})[name];
                const kind = lokid.kindOf(name);
                const state = kind === "engine" ? p.State : kind;
                badge.textContent = state;
                badge.className = "lk-state lk-state-" + state;
                if (kind === "external")
                    detail.textContent = "An OpenAI-compatible API elsewhere: the gateway " +
                        "relays this preset's requests to it; nothing runs here.";
                else
                    detail.textContent = broken || (p ? p.Status : "No preset of this name.");
                // The verbs of an engine only: the daemon refuses them for an external
                // preset, and a broken one's start fails for the reason shown.
                verbs.hidden = kind !== "engine";
                const running = RUNNING.includes(state);
                buttons.Start.disabled = running;
                buttons.Stop.disabled = !running;
            },
            unmount() {},
        };
    }

    // --- an external preset: what it is ------------------------------------------

    function mountExternal(box, v) {
        const list = el("dl", "lk-facts");
        list.id = "lk-external";
        box.append(list);
        return {
            update() {
                const p = v.proxy();
                const facts = [["URL", p.Url], ["Upstream model", p.UpstreamModel],
                    ["API key", p.KeyFile ? "from " + p.KeyFile : "none"],
                    ["Reachable", p.Reachable || "not checked yet"]];
                list.replaceChildren(...facts.flatMap(([label, value]) =>
                    [el("dt", "", label), el("dd", "", value)]));
            },
            unmount() {},
        };
    }

    // --- the plan -------------------------------------------------------------

    function argvText(argv) {
        // Shown, never run: quoting only so that a word with a space reads as one.
        return (argv || []).map(a => /^[\w@%+=:,./-]+$/.test(a) ? a : JSON.stringify(a))
                .join(" ");
    }

    function mountPlan(box, v) {
        const argv = el("pre", "lk-argv");
        argv.id = "lk-plan-argv";
        const running = el("div");
        const notes = el("ul", "lk-notes");
        notes.id = "lk-plan-notes";
        const env = el("div", "lk-small lk-muted");
        box.append(argv, running, notes, env);
        let asked = null;       // the Argv that Plan() was last called for
        let planned = null;     // Plan()'s argv: the caller's own view of secrets

        function planExtras(p) {
            // Plan() adds what the properties lack: the environment lokid adds and the
            // secrets (their source, never a value: *** without the right to edit).
            const key = JSON.stringify(p.Argv || []);
            if (key === asked)
                return;
            asked = key;
            planned = null;
            p.call("Plan", [])
                    .then(([plan]) => {
                        planned = lokid.unwrap(plan.argv) || null;
                        argv.textContent = argvText(planned);
                        const envs = lokid.unwrap(plan.env) || {};
                        const secrets = (lokid.unwrap(plan.secrets) || []).map(s =>
                            lokid.unwrap(s.target) + " from " + lokid.unwrap(s.source));
                        const words = Object.entries(envs).map(([k, x]) => k + "=" + x);
                        env.textContent = [words.length ? "Environment: " + words.join(" ") : "",
                            secrets.length ? "Secrets: " + secrets.join(", ") : ""]
                                .filter(Boolean).join(" · ");
                    })
                    .catch(ex => { env.textContent = lokid.describe(ex) });
        }

        return {
            update() {
                const p = v.proxy();
                if (!p) {       // a file that cannot be read: its reason is in the header
                    argv.textContent = "";
                    notes.replaceChildren();
                    env.textContent = "No plan: the preset's file cannot be read.";
                    return;
                }
                // The property's secret values are *** for everyone (it comes with
                // every preset's, in one read); Plan() shows them to who may edit.
                argv.textContent = argvText(planned || p.Argv);
                notes.replaceChildren(...(p.Notes || []).map(n => el("li", "", n)));
                const now = p.RunningArgv || [];
                running.replaceChildren();
                if (p.PendingRestart && now.length) {
                    running.append(el("div", "lk-label lk-label-warning",
                                      "The engine runs an older command line; a restart applies the one above:"),
                                   el("pre", "lk-argv lk-muted", argvText(now)));
                }
                planExtras(p);
            },
            unmount() {},
        };
    }

    // --- the charts -------------------------------------------------------------

    const SERIES = [
        ["rpm", "Requests per minute", s => s.requests_per_min],
        ["prefill", "Prefill tok/s (1 min)", s => (s.prefill_tps || {})["1m"]],
        ["decode", "Decode tok/s (1 min)", s => (s.decode_tps || {})["1m"]],
        ["draft", "Draft acceptance %", s => {
            const a = (s.draft || {}).acceptance;
            return typeof a === "number" ? 100 * a : undefined;
        }],
    ];
    const SVG = "http://www.w3.org/2000/svg";

    function chart(points, now) {
        const w = 240, h = 48;
        const svg = document.createElementNS(SVG, "svg");
        svg.setAttribute("viewBox", "0 0 " + w + " " + h);
        svg.setAttribute("class", "lk-chart");
        const values = points.map(p => p[1]);
        const top = Math.max(1, ...values);
        const line = document.createElementNS(SVG, "polyline");
        line.setAttribute("points", points.map(([t, x]) =>
            (w * (1 - (now - t) / WINDOW_SECONDS)).toFixed(1) + "," +
            (h - 2 - (h - 4) * x / top).toFixed(1)).join(" "));
        svg.appendChild(line);
        return svg;
    }

    function mountCharts(box, v) {
        const samples = [];     // [time, [figure per SERIES]] within the window, oldest first
        const grid = el("div", "lk-charts");
        const cells = {};
        for (const [key, label] of SERIES) {
            const cell = el("figure", "lk-chart-cell");
            cell.id = "lk-chart-" + key;
            const caption = el("figcaption", "lk-small", label);
            const value = el("span", "lk-chart-value");
            caption.append(" ", value);
            cell.append(caption);
            cells[key] = { cell, value };
            grid.appendChild(cell);
        }
        const note = el("p", "lk-muted lk-small",
                        "Sampled while this page is open, the last " +
                        WINDOW_SECONDS / 60 + " minutes.");
        box.append(grid, note);
        let lastStats = null;
        let drawnAt = 0;
        return {
            update() {
                const p = v.proxy();
                const fresh = p && p.Stats !== lastStats;
                // a new sample, or the time axis moved on: not every change of the preset
                if (!fresh && Date.now() - drawnAt < 1000)
                    return;
                drawnAt = Date.now();
                if (fresh) {
                    lastStats = p.Stats;
                    const now = Date.now() / 1000;
                    // only the charted figures: the window holds one per second
                    const st = lokid.stats(p);
                    samples.push([now, SERIES.map(([, , pick]) => pick(st))]);
                    while (samples.length && samples[0][0] < now - WINDOW_SECONDS)
                        samples.shift();
                }
                const now = Date.now() / 1000;
                for (const [i, [key]] of SERIES.entries()) {
                    const points = samples.map(([t, xs]) => [t, xs[i]])
                            .filter(([, x]) => typeof x === "number" && isFinite(x));
                    const last = points.length ? points[points.length - 1][1] : undefined;
                    cells[key].value.textContent = last === undefined ? "–" : lokid.number(last, 1);
                    const old = cells[key].cell.querySelector("svg");
                    if (old)
                        old.remove();
                    cells[key].cell.appendChild(chart(points, now));
                }
            },
            unmount() {},
        };
    }

    // --- its engines (issue 47): replica 1 is its own, each other its own unit -------

    function mountReplicas(box, v) {
        const text = el("p", "lk-muted lk-small");
        const table = el("table", "lk-table");
        table.id = "lk-replicas";
        const head = el("tr");
        for (const h of ["Replica", "Unit", "State", "Port", "In flight"])
            head.appendChild(el("th", null, h));
        const body = el("tbody");
        table.append(el("thead"), body);
        table.tHead.appendChild(head);
        box.append(text, table);
        return {
            update() {
                const p = v.proxy();
                const rows = p ? lokid.plain(p.Replicas || []) : [];
                const most = p ? p.MaxReplicas || 1 : 1;
                text.textContent = most > 1
                    ? "Up to " + most + " engines ([serve] max_replicas): the gateway starts " +
                      "one more when requests wait longer than a load, and stops it when idle."
                    : "One engine ([serve] max_replicas = 1).";
                table.hidden = rows.length < 2;
                body.replaceChildren();
                for (const r of rows) {
                    const tr = el("tr");
                    tr.dataset.index = String(r.index);
                    const state = r.draining ? r.state + " (draining)" : r.state;
                    for (const cell of [String(r.index), r.unit, state, String(r.port || ""),
                        String(r.in_flight || 0)])
                        tr.appendChild(el("td", null, cell));
                    body.appendChild(tr);
                }
            },
            unmount() {},
        };
    }

    // --- failures of automatic speculation ------------------------------------

    function mountFailures(box, v) {
        const text = el("p");
        text.id = "lk-failures-text";
        const clear = el("button", "lk-btn lk-btn-secondary", "Clear");
        clear.type = "button";
        clear.id = "lk-failures-clear";
        const result = el("span", "lk-muted lk-small");
        result.id = "lk-failures-result";
        clear.addEventListener("click", () => {
            const p = v.proxy();
            if (!p)
                return;
            clear.disabled = true;
            p.call("ClearFailures", [])
                    .then(([count]) => {
                        result.textContent = count === 1 ? "1 failure forgotten." : count + " failures forgotten.";
                    })
                    .catch(ex => lokid.showError((lokid.refused(ex) ? "Not permitted: " : "") +
                                                 "ClearFailures " + v.name + " failed.",
                                                 lokid.describe(ex)))
                    .finally(() => { clear.disabled = false });
        });
        box.append(text, clear, result);
        return {
            update() {
                const p = v.proxy();
                const verdict = p ? lokid.stats(p).verdict : undefined;
                const blocked = p ? p.AutoSpecBlocked : "";
                text.textContent = blocked || verdict ||
                    "No failure recorded: automatic speculation is tried where it is safe.";
            },
            unmount() {},
        };
    }

    lokid.sections.push({ id: "external", title: "External API", order: 10,
        kinds: ["external"], mount: mountExternal });
    // A broken preset's Notes are its reason, and Plan() says it too.
    lokid.sections.push({ id: "plan", title: "Plan", order: 10, kinds: ["engine", "broken"],
        mount: mountPlan });
    lokid.sections.push({ id: "replicas", title: "Replicas", order: 15, kinds: ["engine"],
        mount: mountReplicas });
    lokid.sections.push({ id: "charts", title: "Activity", order: 20, kinds: ["engine"],
        mount: mountCharts });
    lokid.sections.push({ id: "failures", title: "Failures of automatic speculation",
        order: 60, kinds: ["engine"], mount: mountFailures });

    // --- the view ------------------------------------------------------------

    function show(name) {
        hide();
        const box = $("lk-sections");
        box.replaceChildren();
        const v = { name, proxy: () => proxyOf(name) };
        const mounted = [{ part: header(name) }];
        for (const s of lokid.sections.slice().sort((a, b) => a.order - b.order)) {
            const card = el("section", "lk-card");
            card.id = "lk-section-" + s.id;
            card.appendChild(el("h3", "lk-card-title", s.title));
            const inner = el("div");
            card.appendChild(inner);
            box.appendChild(card);
            try {
                mounted.push({ part: s.mount(inner, v), card, kinds: s.kinds });
            } catch (ex) {
                inner.textContent = String(ex);
            }
        }
        view = { name, mounted };
        update();
    }

    function update() {
        if (!view)
            return;
        const kind = lokid.kindOf(view.name);
        for (const { part, card, kinds } of view.mounted) {
            const shown = !kinds || kinds.includes(kind);
            if (card)
                card.hidden = !shown;
            if (!shown)
                continue;
            try {
                part.update();
            } catch (ex) {
                console.error("lokid section", ex);
            }
        }
    }

    function hide() {
        if (!view)
            return;
        for (const { part } of view.mounted) {
            try {
                part.unmount();
            } catch (ex) {
                console.error("lokid section", ex);
            }
        }
        view = null;
    }

    lokid.onChange(update);
    lokid.showPreset = show;
    lokid.hidePreset = hide;
}());
