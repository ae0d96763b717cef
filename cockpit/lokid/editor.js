/*
 * Editing presets (issue 15's methods on the Manager), as the seed's editor did:
 *
 * - a preset's view gets an "Edit" card: its file's text as it is
 *   (GetPresetSource: text and version), saved whole with UpdatePreset over the
 *   version read; the daemon's refusal is shown in its own words, and where it
 *   names a line ("…/NAME.toml:LINE: key: why") that line is marked beside the
 *   text. The daemon writes nothing it refuses, so the file stays as it was;
 * - a form for the common keys (model, ctx, gpus, port, [spec] mode and draft,
 *   the [chat] defaults; for an external preset, kind = "external" in its file,
 *   its url, upstream_model and api_key_file instead: the daemon refuses an
 *   engine's key there) sends only the keys changed, through SetPresetKeys (the
 *   file's comments and layout kept), and a field emptied through UnsetPresetKeys;
 * - the draft picker lists DraftCandidates as the daemon orders them (a model
 *   with its own MTP head first, then MTP heads, then draft models; never the
 *   model itself);
 * - an edit over a version that is no longer the file's (another editor, a
 *   shell) is refused by the daemon with Busy: the card says "changed
 *   elsewhere" and offers Reload, and never sends the edit again over it;
 * - Rename and Delete, with a confirm step in the page; the daemon's guards
 *   (running, the model another preset's draft) come back as Busy, and "with
 *   force" is offered only when its message says force would do it;
 * - the overview gets a "New preset" form (CreatePreset), which opens the new
 *   preset's view.
 *
 * Nothing here decides a right: a caller outside group loki is refused by
 * polkit (PermissionDenied), and that refusal is what the card shows.
 */
"use strict";

(function () {
    const { el } = lokid;
    const BUSY = "org.lokid.Lokid1.Error.Busy";
    const INVALID_PRESET = "org.lokid.Lokid1.Error.InvalidPreset";
    // Where the daemon's message says a file's line is: "/etc/loki/presets/x.toml:3: …"
    const AT_LINE = /\.toml:(\d+):\s*/;
    const SPEC_MODES = ["off", "auto", "mtp", "ngram", "mtp+ngram"];
    const EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh"];
    // [key, label, kind, preset]; kind says how a field's text becomes a D-Bus value (the
    // types SetPresetKeys takes: s, x, d, b, as, ax). A value the field cannot read as its
    // kind is sent as text: the daemon then says what would be valid. preset: the kind of
    // preset the key belongs to (lokid.core.config.external's EXTERNAL_KEYS), engine when absent.
    const FIELDS = [
        ["url", "URL (/v1 included)", "s", "external"],
        ["upstream_model", "Upstream model", "s", "external"],
        ["api_key_file", "API key file", "s", "external"],
        ["model", "Model", "s"],
        ["ctx", "Context (tokens)", "x"],
        ["gpus", "GPUs", "gpus"],
        ["port", "Port", "x"],
        ["spec.mode", "Speculation mode", SPEC_MODES],
        ["spec.draft", "Draft", "draft"],
        ["chat.temperature", "Chat temperature", "d"],
        ["chat.top_p", "Chat top_p", "d"],
        ["chat.top_k", "Chat top_k", "x"],
        ["chat.min_p", "Chat min_p", "d"],
        ["chat.reasoning_effort", "Chat reasoning effort", EFFORTS],
    ];

    // The daemon's message, "Not permitted:" first on polkit's refusal.
    function words(ex) {
        return (lokid.refused(ex) ? "Not permitted: " : "") + lokid.describe(ex);
    }

    // {line, text}: the line the message names (null when none) and the rest of it.
    function located(message) {
        const m = AT_LINE.exec(message || "");
        if (!m)
            return { line: null, text: message };
        return { line: Number(m[1]), text: message.slice(m.index + m[0].length) };
    }

    // --- reading the keys the form shows -------------------------------------------
    // Enough TOML for one-line settings (key = value under [table]); the file itself
    // is the daemon's to read: a value this misreads only fills a field, and nothing
    // is sent unless that field is changed.

    function scalar(s) {
        s = s.trim();
        let m = /^"((?:[^"\\]|\\.)*)"/.exec(s);
        if (m) {
            try {
                return JSON.parse('"' + m[1] + '"');
            } catch (ex) {
                return m[1];
            }
        }
        m = /^'([^']*)'/.exec(s);
        if (m)
            return m[1];
        m = /^\[([^\]]*)\]/.exec(s);
        if (m)
            return m[1].split(",").map(scalar).filter(x => x !== "").join(", ");
        return s.replace(/\s*#.*$/, "");
    }

    function readKeys(text) {
        const out = {};
        let table = "";
        for (const raw of (text || "").split("\n")) {
            const line = raw.trim();
            let m = /^\[\s*([A-Za-z0-9_.-]+)\s*\]/.exec(line);
            if (m) {
                table = m[1];
                continue;
            }
            m = /^([A-Za-z0-9_.-]+)\s*=\s*(.*)$/.exec(line);
            if (m)
                out[(table ? table + "." : "") + m[1]] = scalar(m[2]);
        }
        return out;
    }

    function variant(kind, text) {
        const t = text.trim();
        if (kind === "x" && /^-?\d+$/.test(t))
            return cockpit.variant("x", Number(t));
        if (kind === "d" && t !== "" && isFinite(Number(t)))
            return cockpit.variant("d", Number(t));
        if (kind === "gpus" && /^\d+(\s*,\s*\d+)*$/.test(t))
            return cockpit.variant("ax", t.split(",").map(x => Number(x.trim())));
        return cockpit.variant("s", t);
    }

    // --- small parts ------------------------------------------------------------------

    function button(label, id, cls) {
        const b = el("button", "lk-btn " + (cls || "lk-btn-secondary"), label);
        b.type = "button";
        if (id)
            b.id = id;
        return b;
    }

    function fieldId(key) {
        return "lk-edit-key-" + key.replace(/[._]/g, "-");
    }

    // A message line: PREFIX, then the daemon's words, the line they name first as
    // "line N: …"; that line (null when none).
    function say(target, message, kind, prefix) {
        target.replaceChildren();
        target.className = "lk-edit-message" + (kind ? " lk-edit-" + kind : "");
        target.hidden = !message;
        if (!message)
            return null;
        if (prefix)
            target.append(prefix + ": ");
        const at = located(message);
        if (at.line !== null) {
            const where = el("strong", "lk-edit-line-ref", "line " + at.line + ": ");
            where.dataset.line = String(at.line);
            target.append(where, at.text);
        } else {
            target.append(message);
        }
        return at.line;
    }

    // --- the Edit card ----------------------------------------------------------------

    function mount(box, view) {
        const name = view.name;
        let etag = "";              // the version the text (and the form) was read at
        let keys = {};              // the form's values as read
        let gone = false;

        const status = el("p", "lk-edit-message");
        status.id = "lk-edit-status";
        status.hidden = true;

        const conflict = el("div", "lk-edit-conflict");
        conflict.id = "lk-edit-conflict";
        conflict.hidden = true;
        const conflictText = el("span");
        const reload = button("Reload", "lk-edit-reload");
        conflict.append(el("strong", "", "Changed elsewhere. "), conflictText, reload);

        // the source, with a gutter of line numbers that marks the line the daemon named
        const wrap = el("div", "lk-edit-source");
        const gutter = el("pre", "lk-edit-gutter");
        gutter.id = "lk-edit-gutter";
        gutter.setAttribute("aria-hidden", "true");
        const source = el("textarea", "lk-edit-text");
        source.id = "lk-edit-source";
        source.spellcheck = false;
        source.setAttribute("aria-label", "The preset's file");
        wrap.append(gutter, source);
        let badLine = null;

        const save = button("Save", "lk-edit-save", "lk-btn-primary");
        const revert = button("Load again", "lk-edit-load");
        const sourceBar = el("div", "lk-edit-bar");
        sourceBar.append(save, revert);

        // the form
        const form = el("div", "lk-edit-form");
        form.id = "lk-edit-form";
        const inputs = {};
        for (const [key, label, kind, preset] of FIELDS) {
            const row = el("label", "lk-edit-field");
            row.dataset.preset = preset || "engine";
            row.hidden = row.dataset.preset !== "engine";   // until the file says
            row.append(el("span", "lk-edit-field-label", label));
            let input;
            if (Array.isArray(kind) || kind === "draft") {
                input = el("select");
                if (Array.isArray(kind))
                    options(input, [["", "(not set)"]].concat(kind.map(k => [k, k])), "");
            } else {
                input = el("input");
                input.type = "text";
            }
            input.id = fieldId(key);
            input.dataset.key = key;
            inputs[key] = { input, kind, row };
            row.append(input);
            form.append(row);
        }
        const draftNote = el("p", "lk-muted lk-small");
        draftNote.id = "lk-edit-draft-note";
        const apply = button("Apply changed keys", "lk-edit-apply", "lk-btn-primary");
        const formBar = el("div", "lk-edit-bar");
        formBar.append(apply);

        // rename and delete
        const manage = el("div", "lk-edit-bar");
        const newName = el("input");
        newName.type = "text";
        newName.id = "lk-edit-new-name";
        newName.placeholder = "new name";
        newName.setAttribute("aria-label", "New name");
        const rename = button("Rename", "lk-edit-rename");
        const del = button("Delete…", "lk-edit-delete", "lk-btn-danger");
        manage.append(newName, rename, del);
        const confirm = el("div", "lk-edit-confirm");
        confirm.id = "lk-edit-confirm";
        confirm.hidden = true;
        const yes = button("Delete " + name, "lk-edit-delete-yes", "lk-btn-danger");
        const no = button("Cancel", "lk-edit-delete-no");
        confirm.append(el("span", "", "Delete preset " + name +
                          " (its file, its benchmark result and recorded failures)?"), yes, no);
        const force = button("", "lk-edit-force", "lk-btn-danger");
        force.hidden = true;
        const manageMsg = el("p", "lk-edit-message");
        manageMsg.id = "lk-edit-manage-message";
        manageMsg.hidden = true;

        box.append(status, conflict,
                   el("h4", "lk-edit-heading", "File"), wrap, sourceBar,
                   el("h4", "lk-edit-heading", "Common keys"), form, draftNote, formBar,
                   el("h4", "lk-edit-heading", "Rename or delete"), manage, confirm, force,
                   manageMsg);

        function options(select, pairs, current) {
            select.replaceChildren(...pairs.map(([value, label]) => {
                const o = el("option", "", label);
                o.value = value;
                return o;
            }));
            if (current && !pairs.some(([value]) => value === current)) {
                const o = el("option", "", current + " (as set)");
                o.value = current;
                select.appendChild(o);
            }
            select.value = current || "";
        }

        function drawGutter() {
            const count = Math.max(1, source.value.split("\n").length);
            const lines = [];
            for (let i = 1; i <= count; i++) {
                const n = el("span", i === badLine ? "lk-edit-bad" : "", String(i));
                if (i === badLine)
                    n.id = "lk-edit-bad-line";
                lines.push(n, document.createTextNode("\n"));
            }
            gutter.replaceChildren(...lines);
            source.rows = Math.min(30, Math.max(8, count + 1));
            gutter.scrollTop = source.scrollTop;
        }

        function mark(line) {
            badLine = line;
            drawGutter();
        }

        // the file says what the preset is (the object, when the file cannot be read)
        function external() {
            return keys.kind === "external";
        }

        function fill(known) {
            keys = known;
            const which = external() ? "external" : "engine";
            for (const { row } of Object.values(inputs))
                row.hidden = row.dataset.preset !== which;
            for (const [key, { input, kind }] of Object.entries(inputs)) {
                const value = keys[key] === undefined ? "" : String(keys[key]);
                if (Array.isArray(kind))
                    options(input, [["", "(not set)"]].concat(kind.map(k => [k, k])), value);
                else if (kind !== "draft")
                    input.value = value;
            }
            if (external())
                draftNote.textContent = "";
            else
                drafts();
        }

        function drafts() {
            const input = inputs["spec.draft"].input;
            const current = keys["spec.draft"] || "";
            options(input, [["", "(not set)"]], current);
            lokid.manager.call("DraftCandidates", [name])
                    .then(([found]) => {
                        if (gone)
                            return;
                        const pairs = [];
                        const notes = [];
                        for (const c of found) {
                            const file = lokid.unwrap(c.file) || "";
                            const kind = lokid.unwrap(c.kind) || "";
                            const note = lokid.unwrap(c.note) || "";
                            const size = lokid.unwrap(c.size_mib);
                            if (!file) {        // none-needed: the model holds its own head
                                notes.push(note);
                                continue;
                            }
                            pairs.push([file, file + " — " + kind +
                                        (typeof size === "number" ? ", " + size + " MiB" : "")]);
                        }
                        options(input, [["", notes.length ? "(none needed)" : "(not set)"]]
                                .concat(pairs), current);
                        draftNote.textContent = notes.length
                            ? notes.join(" ")
                            : pairs.length ? "" : "No draft model or MTP head found beside the model or in model_dirs.";
                    })
                    .catch(ex => {
                        if (!gone)
                            draftNote.textContent = "Draft candidates: " + words(ex);
                    });
        }

        function load() {
            conflict.hidden = true;
            return lokid.manager.call("GetPresetSource", [name])
                    .then(([text, version]) => {
                        if (gone)
                            return;
                        etag = version;
                        source.value = text;
                        source.readOnly = false;
                        save.disabled = false;
                        mark(null);
                        fill(readKeys(text));
                    })
                    .catch(ex => {
                        if (gone)
                            return;
                        // Not readable to this caller (polkit), or not a text file: the
                        // daemon's words; the form can still be tried, and is refused the
                        // same way if the right is missing.
                        etag = "";
                        source.value = "";
                        source.readOnly = true;
                        save.disabled = true;
                        mark(null);
                        say(status, words(ex), "error", "The file cannot be shown");
                        // what the preset's object tells anyone, for the form to start from
                        const p = view.proxy();
                        const known = {};
                        if (p && p.Kind === "external") {
                            known.kind = "external";
                            known.url = p.Url;
                            known.upstream_model = p.UpstreamModel;
                        }
                        if (p && p.Model)
                            known.model = p.Model;
                        if (p && p.SpecMode && p.SpecMode !== "off")
                            known["spec.mode"] = p.SpecMode;
                        fill(known);
                    });
        }

        // A refused edit: Busy over a version that is no longer the file's is a
        // conflict (asked again, never retried over); the others are said as they come.
        function refused(ex, what) {
            if (ex && ex.name === BUSY) {
                return lokid.manager.call("GetPresetSource", [name])
                        .then(([, now]) => {
                            if (now !== etag) {
                                status.hidden = true;
                                conflictText.textContent = "The file was changed by another " +
                                    "program or editor since it was read here; nothing was " +
                                    "written. " + lokid.describe(ex) + " ";
                                conflict.hidden = false;
                            } else {
                                say(status, words(ex), "error", what);
                            }
                        })
                        .catch(() => say(status, words(ex), "error", what));
            }
            const line = say(status, words(ex), "error", what);
            mark(ex && ex.name === INVALID_PRESET ? line : null);
            return Promise.resolve();
        }

        function busy(b, promise) {
            b.disabled = true;
            return promise.finally(() => {
                b.disabled = false;
                lokid.changed();
            });
        }

        source.addEventListener("input", drawGutter);
        source.addEventListener("scroll", () => { gutter.scrollTop = source.scrollTop });
        reload.addEventListener("click", () => {
            status.hidden = true;
            load();
        });
        revert.addEventListener("click", () => {
            status.hidden = true;
            load();
        });

        save.addEventListener("click", () => {
            status.hidden = true;
            busy(save, lokid.manager.call("UpdatePreset", [name, source.value, etag])
                    .then(([version]) => {
                        etag = version;
                        mark(null);
                        say(status, "Saved. A running engine takes it at its next start.", "ok");
                        fill(readKeys(source.value));
                    })
                    .catch(ex => refused(ex, "The file was not saved")));
        });

        apply.addEventListener("click", () => {
            status.hidden = true;
            const set = {};
            const unset = [];
            for (const [key, { input, kind, row }] of Object.entries(inputs)) {
                if (row.hidden)
                    continue;
                const was = keys[key] === undefined ? "" : String(keys[key]);
                const now = input.value.trim();
                if (now === was.trim())
                    continue;
                if (now === "") {
                    if (keys[key] !== undefined)
                        unset.push(key);
                } else {
                    set[key] = variant(Array.isArray(kind) || kind === "draft" ? "s" : kind, now);
                }
            }
            if (!Object.keys(set).length && !unset.length) {
                say(status, "Nothing changed.", "ok");
                return;
            }
            let chain = Promise.resolve([etag]);
            if (Object.keys(set).length)
                chain = chain.then(([v]) => lokid.manager.call("SetPresetKeys", [name, set, v]));
            if (unset.length)
                chain = chain.then(([v]) => lokid.manager.call("UnsetPresetKeys", [name, unset, v]));
            busy(apply, chain
                    .then(() => load())
                    .then(() => say(status, "Saved: " + Object.keys(set).concat(unset).join(", ") +
                                    ". A running engine takes it at its next start.", "ok"))
                    .catch(ex => refused(ex, "The keys were not saved")));
        });

        // --- rename and delete --------------------------------------------------------

        let forced = null;          // what the force button does, while it is offered
        force.addEventListener("click", () => {
            if (forced)
                forced();
        });

        function guarded(verb, call, done) {
            force.hidden = true;
            forced = null;
            manageMsg.hidden = true;
            return call(false).then(done).catch(ex => {
                say(manageMsg, words(ex), "error", verb + " " + name);
                // Force only where the daemon says it would do it (running, a draft).
                if (ex && ex.name === BUSY && /\bwith force\b/.test(lokid.describe(ex))) {
                    force.textContent = verb + " with force";
                    force.hidden = false;
                    forced = () => busy(force, call(true).then(done).catch(e => {
                        force.hidden = true;
                        say(manageMsg, words(e), "error", verb + " " + name);
                    }));
                }
            });
        }

        rename.addEventListener("click", () => {
            const to = newName.value.trim();
            if (!to) {
                say(manageMsg, "Type the new name first.", "error");
                return;
            }
            busy(rename, guarded("Rename",
                                 f => lokid.manager.call("RenamePreset", [name, to, f]),
                                 () => cockpit.location.go(["preset", to])));
        });
        del.addEventListener("click", () => {
            confirm.hidden = false;
            force.hidden = true;
        });
        no.addEventListener("click", () => { confirm.hidden = true });
        yes.addEventListener("click", () => {
            confirm.hidden = true;
            busy(del, guarded("Delete",
                              f => lokid.manager.call("DeletePreset", [name, f]),
                              () => cockpit.location.go([])));
        });

        load();
        return {
            update() {},
            unmount() { gone = true },
        };
    }

    lokid.sections.push({ id: "editor", title: "Edit", order: 40, mount });

    // --- a new preset, from the overview ------------------------------------------

    function createForm() {
        const overview = lokid.$("lk-overview");
        if (!overview)
            return;
        const box = el("details", "lk-edit-create");
        box.id = "lk-create";
        const summary = el("summary", "", "New preset");
        const nameInput = el("input");
        nameInput.type = "text";
        nameInput.id = "lk-create-name";
        nameInput.placeholder = "name";
        nameInput.setAttribute("aria-label", "Name of the new preset");
        const text = el("textarea", "lk-edit-text");
        text.id = "lk-create-text";
        text.rows = 6;
        text.spellcheck = false;
        text.setAttribute("aria-label", "Its file");
        const go = button("Create", "lk-create-go", "lk-btn-primary");
        const message = el("p", "lk-edit-message");
        message.id = "lk-create-message";
        message.hidden = true;
        const bar = el("div", "lk-edit-bar");
        bar.append(nameInput, go);
        box.append(summary, bar, text, message);
        overview.appendChild(box);

        box.addEventListener("toggle", () => {
            // a start for the text: the model of a preset there is, else the key to fill
            if (box.open && !text.value) {
                const first = Object.values(lokid.presets())[0];
                text.value = "model = " + JSON.stringify(first ? first.Model : "") + "\n";
            }
        });
        go.addEventListener("click", () => {
            const to = nameInput.value.trim();
            message.hidden = true;
            go.disabled = true;
            lokid.manager.call("CreatePreset", [to, text.value])
                    .then(() => {
                        box.open = false;
                        nameInput.value = "";
                        text.value = "";
                        cockpit.location.go(["preset", to]);
                    })
                    .catch(ex => say(message, words(ex), "error", "CreatePreset " + to))
                    .finally(() => {
                        go.disabled = false;
                        lokid.changed();
                    });
        });
    }

    createForm();
}());
