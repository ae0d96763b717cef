/*
 * The overview's model pulls card (issue 48): the models lokid fetches to the server, as
 * lokictl pull and lokictl pulls show them, over org.lokid.Lokid1.Pulls with the
 * logged-in user's own rights. Rules, each for the failure it prevents:
 *
 * - the list is ListPulls, read at load and again when a PullProgress signal names a
 *   unit the page does not know (a pull started from a shell, or from another browser)
 *   or ends one (a finished pull's model file name is in ListPulls, not in the signal);
 *   every other signal updates its row in place: no bus call on a timer, and a download
 *   of gigabytes is followed without a reload;
 * - a row is updated in place, never drawn again whole: a Cancel button replaced twice a
 *   second under the pointer would swallow the operator's click;
 * - the daemon's words for a refusal (InvalidArgs naming what is wrong in a reference, a
 *   directory that is not one, Busy naming the unit, polkit's "not permitted" with the
 *   action's name) are shown in the card, under the form the operator just used, never
 *   the page's alert;
 * - the card is shown on the overview whenever the interface exists, "No pulls" when the
 *   list is empty (the form is how a first pull starts); it hides on a preset's view and
 *   where the interface is missing (an older lokid);
 * - ListPulls is for anyone; Pull and CancelPull need polkit's org.lokid.lokid1.manage,
 *   so a user outside group loki sees the list and is refused the verbs in words.
 */
"use strict";

(function () {
    const { client, $, el, plain, missing } = lokid;
    const PULLS = "org.lokid.Lokid1.Pulls";
    const PATH = "/org/lokid/Lokid1";
    const ACTION = "org.lokid.lokid1.manage";
    const FINAL = ["done", "failed", "stopped"];
    const SAYS_DETAIL = ["waiting", "failed", "stopped"];
    const pulls = new Map();    // unit -> ListPulls' row, updated by PullProgress
    let listing = false;
    let again = false;          // a signal asked for the list while one was on its way
    let read = false;           // ListPulls answered once: the interface exists

    function call(verb, args) {
        return client.call(PATH, PULLS, verb, args);
    }

    function words(ex) {        // the daemon's words, a refusal naming the action
        return lokid.said(ex, ACTION);
    }

    function size(bytes) {
        if (bytes >= 2 ** 30)
            return (bytes / 2 ** 30).toFixed(2) + " GiB";
        if (bytes >= 2 ** 20)
            return (bytes / 2 ** 20).toFixed(1) + " MiB";
        return Math.round(bytes / 2 ** 10) + " KiB";
    }

    // --- the card, made here (index.html only loads this file) ------------------------

    function field(form, id, label, hint) {
        const l = form.appendChild(el("label", "lk-edit-field"));
        l.appendChild(el("span", "lk-edit-field-label", label));
        const input = l.appendChild(el("input"));
        input.id = id;
        input.autocomplete = "off";
        if (hint)
            input.placeholder = hint;
        return input;
    }

    function card() {
        let c = $("lk-pulls");
        if (c)
            return c;
        c = el("section", "lk-card");
        c.id = "lk-pulls";
        c.hidden = true;
        c.setAttribute("aria-labelledby", "lk-pulls-title");
        c.appendChild(el("h2", "lk-card-title", "Model pulls")).id = "lk-pulls-title";
        const empty = c.appendChild(el("p", "lk-muted", "No pulls."));
        empty.id = "lk-pulls-empty";
        const wrap = c.appendChild(el("div", "lk-table-wrap"));
        wrap.id = "lk-pulls-list";
        const table = wrap.appendChild(el("table", "lk-table"));
        const head = table.appendChild(el("thead")).appendChild(el("tr"));
        for (const name of ["Reference", "Directory", "State", "Progress", "Model or why"])
            head.appendChild(el("th", "", name)).setAttribute("scope", "col");
        head.appendChild(el("th")).appendChild(el("span", "lk-sr-only", "Actions"));
        table.appendChild(el("tbody")).id = "lk-pulls-rows";
        const form = c.appendChild(el("form", "lk-edit-form"));
        form.id = "lk-pulls-form";
        form.noValidate = true;
        field(form, "lk-pull-reference", "Reference (org/repo:Q4_K_M, org/repo/file.gguf, " +
              "a URL)", "org/repo:Q4_K_M").required = true;
        field(form, "lk-pull-directory", "Directory (empty: the first of model_dirs)",
              "/var/lib/loki/models");
        const bar = form.appendChild(el("div", "lk-edit-bar"));
        const go = bar.appendChild(el("button", "lk-btn lk-btn-primary", "Pull"));
        go.type = "submit";
        go.id = "lk-pull-start";
        const error = c.appendChild(el("p", "lk-edit-message lk-edit-error"));
        error.id = "lk-pulls-error";
        error.setAttribute("role", "alert");
        error.hidden = true;
        form.addEventListener("submit", start);
        const after = $("lk-keys") || $("lk-usage");
        if (after && after.parentNode)
            after.parentNode.insertBefore(c, after.nextSibling);
        else
            document.body.appendChild(c);
        return c;
    }

    // --- rows ---------------------------------------------------------------------------

    function newRow(unit) {
        const tr = el("tr");
        tr.dataset.unit = unit;
        tr.appendChild(el("th", "lk-pull-reference")).setAttribute("scope", "row");
        tr.appendChild(el("td", "lk-pull-directory"));
        tr.appendChild(el("td", "lk-pull-state"));
        tr.appendChild(el("td", "lk-pull-progress"))
                .append(el("progress", "lk-pull-bar"), el("span", "lk-pull-bytes lk-small"));
        tr.appendChild(el("td", "lk-pull-detail"));
        const cancel = tr.appendChild(el("td", "lk-cell-actions"))
                .appendChild(el("button", "lk-btn", "Cancel"));
        cancel.type = "button";
        cancel.dataset.verb = "CancelPull";
        cancel.addEventListener("click", () => stop(unit, cancel));
        return tr;
    }

    // What the last column says: the model's file name once done (the other files with
    // it, an mmproj), why for waiting, failed and stopped, the file being fetched else.
    function detail(p) {
        if (p.state === "done") {
            const others = (p.files || []).filter(f => f !== p.model);
            return (p.model || (p.files || []).join(", ")) +
                (p.model && others.length ? " (with " + others.join(", ") + ")" : "");
        }
        if (SAYS_DETAIL.includes(p.state))
            return p.detail || "";
        return p.file || "";
    }

    function fill(tr, p) {
        const [ref, dir, state, prog, why, actions] = tr.children;
        ref.textContent = p.reference;
        dir.textContent = p.directory;
        state.textContent = p.state;
        const [bar, text] = prog.children;
        const total = p.total || 0;
        const done = p.state === "done" && total ? total : p.done || 0;
        if (total) {
            bar.max = total;
            bar.value = Math.min(done, total);
            const pct = Math.floor(100 * Math.min(done, total) / total);
            text.textContent = " " + pct + " % · " + size(done) + " of " + size(total);
        } else {
            bar.removeAttribute("value");       // indeterminate: the size is not known yet
            text.textContent = done ? " " + size(done) : "";
        }
        bar.hidden = FINAL.includes(p.state) && !total;
        why.textContent = detail(p);
        why.title = why.textContent;
        tr.dataset.state = p.state;
        tr.dataset.done = String(done);
        tr.dataset.total = String(total);
        actions.firstChild.hidden = FINAL.includes(p.state);
    }

    function draw() {
        const c = card();
        const body = $("lk-pulls-rows");
        const rows = new Map([...body.children].map(tr => [tr.dataset.unit, tr]));
        for (const [unit, tr] of rows)
            if (!pulls.has(unit))
                tr.remove();
        for (const [unit, p] of pulls) {
            const tr = rows.get(unit) || body.appendChild(newRow(unit));
            fill(tr, p);
        }
        $("lk-pulls-empty").hidden = pulls.size > 0;
        $("lk-pulls-list").hidden = pulls.size === 0;
        c.hidden = !read || cockpit.location.path[0] === "preset";
    }

    // --- the bus -----------------------------------------------------------------------

    function refresh() {
        if (listing) {
            again = true;
            return;
        }
        listing = true;
        call("ListPulls", [])
                .then(([list]) => {
                    read = true;
                    pulls.clear();
                    for (const p of plain(list))
                        pulls.set(p.unit, p);
                    draw();
                })
                .catch(ex => {
                    read = !missing(ex);    // else an older lokid
                    draw();
                    if (read)
                        failed("ListPulls", ex);
                })
                .finally(() => {
                    listing = false;
                    if (again) {
                        again = false;
                        refresh();
                    }
                });
    }

    // PullProgress: its row updated in place; the list read again for a unit not known
    // here, and at a pull's end (the model's file name and the files are in ListPulls).
    function progressed(path, iface, signal, args) {
        const [unit, reference, state, done, total, text] = args;
        const p = pulls.get(unit);
        if (p) {
            Object.assign(p, { reference, state, done, total });
            if (SAYS_DETAIL.includes(state))
                p.detail = text;
            else if (state === "done")      // its files, until the list names the model
                p.files = text ? text.split(", ") : [];
            draw();
        }
        if (!p || FINAL.includes(state))
            refresh();
    }

    function failed(what, ex) {
        const box = $("lk-pulls-error");
        box.textContent = what + " failed. " + words(ex);
        box.hidden = false;
    }

    function start(ev) {
        ev.preventDefault();
        const reference = $("lk-pull-reference").value.trim();
        const directory = $("lk-pull-directory").value.trim();
        const go = $("lk-pull-start");
        $("lk-pulls-error").hidden = true;
        go.disabled = true;
        call("Pull", [reference, directory])
                .then(() => { $("lk-pull-reference").value = "" })
                .catch(ex => failed("Pull " + reference, ex))
                .finally(() => {
                    go.disabled = false;
                    refresh();
                });
    }

    function stop(unit, button) {
        const p = pulls.get(unit);
        $("lk-pulls-error").hidden = true;
        button.disabled = true;
        call("CancelPull", [unit])
                .catch(ex => failed("CancelPull " + (p ? p.reference : unit), ex))
                .finally(() => {
                    button.disabled = false;
                    refresh();
                });
    }

    card();
    client.subscribe({ path: PATH, interface: PULLS, member: "PullProgress" }, progressed);
    cockpit.addEventListener("locationchanged", draw);
    refresh();
}());
