/*
 * What every part of lokid's Cockpit page shares: the connection to
 * lokid.service on the system bus (cockpit.dbus, with the logged-in user's
 * rights), one proxy per preset object, the page's alert, and the registry
 * the preset view's sections (plan, journal, editor, benchmark, chat) join.
 *
 * Loaded first, after Cockpit's cockpit.js; each other file adds to the one
 * global `lokid` and draws only in its own elements. Nothing here decides a
 * right: a refusal is the daemon's (polkit's) own words, shown as they come.
 */
"use strict";

window.lokid = (function () {
    const BUS_NAME = "org.lokid.Lokid1";
    const MANAGER_PATH = "/org/lokid/Lokid1";
    const MANAGER = "org.lokid.Lokid1.Manager";
    const PRESET = "org.lokid.Lokid1.Preset";
    const PERMISSION_DENIED = "org.lokid.Lokid1.Error.PermissionDenied";
    const RUNNING = ["loading", "ready", "stopping"];     // an engine's states while it runs

    const client = cockpit.dbus(BUS_NAME, { bus: "system" });
    const manager = client.proxy(MANAGER, MANAGER_PATH);
    // Every preset object under one watch of their path namespace: the bridge reads
    // them all with one GetManagedObjects and follows InterfacesAdded/Removed (a
    // proxy per path cost a watch, an Introspect and a GetAll each: 50 presets drew
    // in 2.7 s). A path gone from the daemon is gone from here too.
    const proxies = client.proxies(PRESET, MANAGER_PATH + "/preset");
    const listeners = [];
    let scheduled = false;

    const $ = id => document.getElementById(id);

    function el(tag, cls, text) {
        const e = document.createElement(tag);
        if (cls)
            e.className = cls;
        if (text !== undefined && text !== null)
            e.textContent = text;
        return e;
    }

    // a{sv} values arrive as {t: signature, v: value}; nested ones too.
    function unwrap(variant) {
        return variant && typeof variant === "object" && "v" in variant && "t" in variant
            ? variant.v : variant;
    }

    // a{sv} (and lists of them) as plain values, all the way down.
    function plain(value) {
        const v = unwrap(value);
        if (Array.isArray(v))
            return v.map(plain);
        if (v && typeof v === "object") {
            const out = {};
            for (const [k, x] of Object.entries(v))
                out[k] = plain(x);
            return out;
        }
        return v;
    }

    function showError(title, text) {
        $("lk-alert-title").textContent = title;
        $("lk-alert-text").textContent = text || "";
        $("lk-alert").hidden = false;
    }

    function clearError() {
        $("lk-alert").hidden = true;
    }

    function refused(ex) {
        return !!ex && ex.name === PERMISSION_DENIED;
    }

    // The daemon's words for a card's own message; a polkit refusal always names the
    // action (keys, pulls).
    function said(ex, action) {
        const text = describe(ex);
        if (!refused(ex))
            return text;
        return "Not permitted: " + text + (text.includes(action) ? "" : " (polkit action " +
                                           action + ")");
    }

    // An error that says the daemon has no such interface or method: an older lokid,
    // whose cards for it hide (keys, pulls).
    const MISSING = ["org.freedesktop.DBus.Error.UnknownMethod",
        "org.freedesktop.DBus.Error.UnknownInterface",
        "org.freedesktop.DBus.Error.UnknownObject"];

    function missing(ex) {
        return !!ex && MISSING.includes(ex.name);
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

    // A verb of the Manager on a preset, its failure in the alert ("Not
    // permitted:" first when polkit said no); the reply, or null on a failure.
    function act(verb, args, button) {
        if (button)
            button.disabled = true;
        return manager.call(verb, args)
                .catch(ex => {
                    showError((refused(ex) ? "Not permitted: " : "") + verb + " " + args[0] +
                              " failed.", describe(ex));
                    return null;
                })
                .finally(() => {
                    if (button)
                        button.disabled = false;
                    changed();
                });
    }

    // The preset objects now valid, by name.
    function presets() {
        const byName = {};
        for (const path of manager.Presets || []) {
            const p = proxies[path];
            if (p && p.valid)
                byName[p.Name] = p;
        }
        return byName;
    }

    // What the page shows a preset as: "external" (Kind external: an API elsewhere,
    // nothing runs here, so no engine verbs, keys or benchmark), "broken" (in
    // BrokenPresets and not running: it cannot start as it is, with an object or
    // without; a running one stays an engine, whose next start is what is broken),
    // "engine", or "gone" (nothing of this name, or not read yet).
    // p: its proxy, when the caller holds it already (the overview, for every row).
    function kindOf(name, p = presets()[name]) {
        if (p && p.Kind === "external")
            return "external";
        if ((manager.BrokenPresets || {})[name] && !(p && RUNNING.includes(p.State)))
            return "broken";
        return p ? "engine" : "gone";
    }

    // Every part redraws at most four times a second, whatever changed: a busy
    // engine's properties change about eight times a second (Stats, LastRequestAt,
    // RequestsInFlight), and drawing each cost the browser 13 % of a CPU for one
    // preset at 50 requests/s (benchmarks/cockpit_page.py).
    const REDRAW_MS = 250;
    let drawn = 0;

    function draw() {
        scheduled = false;
        drawn = performance.now();
        for (const fn of listeners)
            fn();
    }

    function changed() {
        if (scheduled)
            return;
        scheduled = true;
        const wait = drawn + REDRAW_MS - performance.now();
        if (wait > 0)
            window.setTimeout(() => window.requestAnimationFrame(draw), wait);
        else
            window.requestAnimationFrame(draw);
    }

    manager.addEventListener("changed", changed);
    for (const event of ["added", "changed", "removed"])
        proxies.addEventListener(event, changed);
    client.addEventListener("close", (event, options) => {
        showError("The connection to the system bus closed.",
                  options && options.problem ? cockpit.message(options.problem) : "");
    });
    // performance marks: when the daemon's objects arrived (the browser test reports them)
    manager.wait(() => { performance.mark("lokid-manager"); changed() });
    proxies.wait(() => { performance.mark("lokid-presets"); changed() });

    return {
        BUS_NAME,
        client,
        manager,
        $,
        el,
        unwrap,
        plain,
        describe,
        refused,
        missing,
        said,
        showError,
        clearError,
        act,
        presets,
        kindOf,
        RUNNING,
        onChange: fn => listeners.push(fn),
        changed,
        // The preset view's sections: {id, title, order, mount(box, view)}, where
        // view.name is the preset, view.proxy() its proxy now (null while it has
        // none) and mount returns {update(), unmount()} (update on every change);
        // kinds, when given, lists the kindOf() values the card is shown for (hidden,
        // and not updated, for the others).
        sections: [],
    };
}());
