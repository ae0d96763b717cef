/*
 * lokid's Cockpit page, the overview: every preset lokid.service serves (and
 * each broken one with its reason) with its state, model, URL, the speculation
 * its engine uses and why, its on-demand state and a pending restart; Start and
 * Stop call the daemon's StartPreset and StopPreset.
 *
 * Everything shown is a documented D-Bus fact (data/dbus/org.lokid.Lokid1.xml),
 * read through cockpit.dbus on the system bus with the logged-in user's rights:
 * polkit decides what they may do, the page decides nothing and shows a refusal
 * in the daemon's own words. It follows the daemon's PropertiesChanged and
 * signals (EngineStateChanged, JobFinished) and never polls. No build step,
 * nothing fetched from the network: Cockpit's cockpit.js is the only library.
 */
"use strict";

(function () {
    const BUS_NAME = "org.lokid.Lokid1";
    const MANAGER_PATH = "/org/lokid/Lokid1";
    const MANAGER = "org.lokid.Lokid1.Manager";
    const PRESET = "org.lokid.Lokid1.Preset";
    const RUNNING = ["loading", "ready", "stopping"];

    const client = cockpit.dbus(BUS_NAME, { bus: "system" });
    const manager = client.proxy(MANAGER, MANAGER_PATH);
    // One proxy per preset object path, kept once made: cockpit.js has no way to
    // drop a proxy's watch, and a path reappears after a rename back or a reload.
    const proxies = {};
    const rows = {};            // preset name -> its row's elements
    const details = {};         // preset name -> the last EngineStateChanged {state, detail}
    let scheduled = false;

    const $ = id => document.getElementById(id);

    function el(tag, cls, text) {
        const e = document.createElement(tag);
        if (cls)
            e.className = cls;
        if (text !== undefined)
            e.textContent = text;
        return e;
    }

    // a{sv} values arrive as {t: signature, v: value}.
    function unwrap(variant) {
        return variant && typeof variant === "object" && "v" in variant ? variant.v : variant;
    }

    function showError(title, text) {
        $("lk-alert-title").textContent = title;
        $("lk-alert-text").textContent = text;
        $("lk-alert").hidden = false;
    }

    // The daemon's errors carry a message written for the operator (polkit's
    // refusal included); a transport problem has only Cockpit's problem code.
    function describe(ex) {
        if (ex && ex.message)
            return ex.message;
        if (ex && ex.problem)
            return cockpit.message(ex.problem);
        return String(ex);
    }

    function act(verb, name, button) {
        button.disabled = true;
        manager.call(verb, [name])
                .catch(ex => {
                    const refused = ex && ex.name === "org.lokid.Lokid1.Error.PermissionDenied";
                    showError((refused ? "Not permitted: " : "") + verb + " " + name + " failed.",
                              describe(ex));
                })
                .finally(() => schedule());
    }

    function newRow(name) {
        const tr = el("tr");
        const cells = {};
        for (const key of ["name", "state", "model", "url", "spec", "ondemand", "actions"]) {
            cells[key] = el("td", "lk-cell-" + key);
            tr.appendChild(cells[key]);
        }
        cells.name.appendChild(el("span", "lk-name", name));
        cells.pending = el("span", "lk-label lk-label-warning", "restart pending");
        cells.pending.title = "The engine runs an older command line than the preset's file asks for";
        cells.name.appendChild(cells.pending);
        cells.badge = el("span", "lk-state");
        cells.detail = el("div", "lk-muted lk-small");
        cells.state.append(cells.badge, cells.detail);
        cells.start = el("button", "lk-btn lk-btn-secondary", "Start");
        cells.stop = el("button", "lk-btn lk-btn-secondary", "Stop");
        cells.start.type = cells.stop.type = "button";
        cells.start.addEventListener("click", () => act("StartPreset", name, cells.start));
        cells.stop.addEventListener("click", () => act("StopPreset", name, cells.stop));
        cells.actions.append(cells.start, cells.stop);
        const err = el("tr", "lk-error-row");
        cells.error = el("td", "lk-error");
        cells.error.colSpan = 7;
        err.appendChild(cells.error);
        return { tr, err, cells };
    }

    function fill(row, name, p, broken) {
        const c = row.cells;
        const state = p ? p.State : "broken";
        const external = p && p.Kind === "external";
        c.badge.textContent = external ? "external" : state;
        c.badge.className = "lk-state lk-state-" + (external ? "external" : state);
        // The signal's detail says why it came to this state; once the state
        // moves on, the supervisor's Status line is the fresher word.
        const last = details[name];
        c.detail.textContent = last && last.state === state ? last.detail : (p ? p.Status : "");
        c.pending.hidden = !(p && p.PendingRestart);
        c.model.textContent = p ? (external ? p.UpstreamModel : p.Model) : "";
        c.url.textContent = p ? (external ? p.Url : unwrap((p.Stats || {}).url) || "") : "";
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
        const running = RUNNING.includes(state);
        c.start.hidden = c.stop.hidden = !p || external;
        c.start.disabled = running;
        c.stop.disabled = !running;
        c.error.textContent = broken || "";
        row.err.hidden = !broken;
    }

    function render() {
        scheduled = false;
        if (!manager.valid) {
            $("lk-table").hidden = true;
            $("lk-status").hidden = false;
            $("lk-status").textContent = "lokid.service does not answer on the system bus.";
            return;
        }
        $("lk-version").textContent = "lokid " + manager.Version;
        const broken = manager.BrokenPresets || {};
        const byName = {};
        for (const path of manager.Presets || []) {
            const p = proxies[path];
            if (p && p.valid)
                byName[p.Name] = p;
        }
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
        $("lk-table").hidden = names.length === 0;
        $("lk-status").hidden = names.length !== 0;
        $("lk-status").textContent = "No presets: lokid reads them from /etc/loki/presets/NAME.toml.";
    }

    // Stats changes every second per running engine: one render per frame at most.
    function schedule() {
        if (!scheduled) {
            scheduled = true;
            window.requestAnimationFrame(render);
        }
    }

    function follow() {
        for (const path of manager.Presets || []) {
            if (!proxies[path]) {
                proxies[path] = client.proxy(PRESET, path);
                proxies[path].addEventListener("changed", schedule);
                proxies[path].wait(schedule);
            }
        }
        schedule();
    }

    manager.addEventListener("changed", follow);
    manager.addEventListener("EngineStateChanged", (event, name, state, detail) => {
        details[name] = { state, detail };
        schedule();
    });
    manager.addEventListener("JobFinished", (event, name, job, verb, result, state, detail) => {
        if (result !== "done")
            showError(verb + " " + name + ": " + result + ".", detail);
    });
    client.addEventListener("close", (event, options) => {
        showError("The connection to the system bus closed.",
                  options && options.problem ? cockpit.message(options.problem) : "");
    });
    $("lk-alert-close").addEventListener("click", () => { $("lk-alert").hidden = true });
    manager.wait(follow);
}());
