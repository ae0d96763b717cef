/*
 * The overview's keys card (issue 46, item 1): the gateway's named client keys,
 * managed over the same D-Bus API as lokictl keys (org.lokid.Lokid1.Keys), with
 * the logged-in user's own rights, as every other verb of the page.
 *
 * - the list is ListKeys as the daemon gives it (name, prefix, class, models,
 *   limits, expiry, state; never a hash), read again on KeysChanged, so a key
 *   added from a shell appears without a reload;
 * - a new or rotated key crosses the bus once, in AddKey's or RotateKey's reply:
 *   it is shown once, in a dialog with a copy button and the warning that it is
 *   not shown again, and the dialog's field is emptied when it closes (nothing of
 *   it is kept by the page);
 * - revoke and rotate ask first, in the card: a revoked key's next request is
 *   refused, and a rotation without grace stops the old key at once;
 * - every right is polkit's (org.lokid.lokid1.manage-keys, ListKeys included:
 *   the list names a team's keys and scopes): a refusal is shown in the daemon's
 *   words with the action's name, in the card, never the page's alert, which
 *   would greet every viewer outside group loki; a lokid without the interface
 *   (an older daemon) hides the card.
 */
"use strict";

(function () {
    const { client, $, el, plain, missing } = lokid;
    const KEYS = "org.lokid.Lokid1.Keys";
    const PATH = "/org/lokid/Lokid1";
    const ACTION = "org.lokid.lokid1.manage-keys";
    // ListKeys' and AddKey's limit names, and how a row says them
    const LIMITS = [["max_in_flight", "in flight"], ["requests_per_minute", "requests/min"],
        ["tokens_per_minute", "tokens/min"], ["tokens_per_day", "tokens/day"],
        ["tokens_per_month", "tokens/month"]];
    let listing = false;
    let again = false;          // a change came while a ListKeys was on its way
    let pending = null;         // the verb the confirm bar asks about: {verb, name}

    function call(verb, args) {
        return client.call(PATH, KEYS, verb, args);
    }

    function words(ex) {        // the daemon's words, a refusal naming the action
        return lokid.said(ex, ACTION);
    }

    function onOverview() {
        return cockpit.location.path[0] !== "preset";
    }

    function utc(seconds, withTime) {
        const iso = new Date(seconds * 1000).toISOString();
        return withTime ? iso.slice(0, 16).replace("T", " ") + " UTC" : iso.slice(0, 10);
    }

    function limits(key) {
        const parts = LIMITS.filter(([n]) => typeof key[n] === "number")
                .map(([n, label]) => key[n].toLocaleString() + " " + label);
        return parts.join(", ") || "none";
    }

    function expiry(key) {
        let text = key.expires ? utc(key.expires, true) : "never";
        if (key.previous_until && key.previous_until * 1000 > Date.now())
            text += "; the old key until " + utc(key.previous_until, true);
        return text;
    }

    function button(label, verb, name) {
        const b = el("button", "lk-btn", label);
        b.type = "button";
        b.dataset.verb = verb;
        b.addEventListener("click", () => ask(verb, name));
        return b;
    }

    function row(key) {
        const tr = el("tr");
        tr.dataset.key = key.name;
        tr.appendChild(el("th", "lk-name", key.name)).setAttribute("scope", "row");
        tr.appendChild(el("td", "lk-key-prefix")).appendChild(el("code", "", key.prefix + "…"));
        tr.appendChild(el("td", "lk-key-class", key.class));
        tr.appendChild(el("td", "lk-key-models", (key.models || []).join(", ") || "every model"));
        tr.appendChild(el("td", "lk-key-limits", limits(key)));
        tr.appendChild(el("td", "lk-key-expires", expiry(key)));
        tr.appendChild(el("td", "lk-key-state", key.state));
        const actions = tr.appendChild(el("td", "lk-cell-actions"));
        if (key.state !== "revoked")
            actions.append(button("Rotate", "RotateKey", key.name),
                           button("Revoke", "RevokeKey", key.name));
        return tr;
    }

    function draw(keys) {
        const body = $("lk-keys-rows");
        body.textContent = "";
        for (const key of keys)
            body.appendChild(row(key));
        $("lk-keys-message").textContent = keys.length ? "" : "No named keys yet.";
        $("lk-keys-message").hidden = keys.length > 0;
        $("lk-keys-list").hidden = false;
        $("lk-keys").hidden = false;
    }

    // Refused, no keys file, a broken one: the daemon's words instead of the list.
    function unlisted(ex) {
        if (missing(ex)) {
            $("lk-keys").hidden = true;
            return;
        }
        $("lk-keys-list").hidden = true;
        $("lk-keys-message").textContent = words(ex);
        $("lk-keys-message").hidden = false;
        $("lk-keys").hidden = false;
    }

    function refresh() {
        if (!onOverview()) {
            $("lk-keys").hidden = true;
            return;
        }
        if (listing) {
            again = true;
            return;
        }
        listing = true;
        call("ListKeys", [])
                .then(([keys]) => draw(plain(keys)))
                .catch(unlisted)
                .finally(() => {
                    listing = false;
                    if (again) {
                        again = false;
                        refresh();
                    }
                });
    }

    function failed(what, ex) {
        const box = $("lk-keys-error");
        box.textContent = what + " failed. " + words(ex);
        box.hidden = false;
    }

    function busy(on) {
        for (const b of $("lk-keys").querySelectorAll("button"))
            b.disabled = on;
    }

    // --- the key, shown once -------------------------------------------------------

    function showKey(name, secret, how) {
        $("lk-key-once-title").textContent = "The " + how + " key of " + name;
        $("lk-key-once-value").value = secret;
        $("lk-key-once-copied").textContent = "";
        $("lk-key-once").showModal();
        $("lk-key-once-value").select();
    }

    function copyKey() {
        const field = $("lk-key-once-value");
        const said = $("lk-key-once-copied");
        const fallback = () => {
            field.select();
            if (!document.execCommand("copy"))
                throw new Error("refused");
        };
        const asked = navigator.clipboard && window.isSecureContext
            ? navigator.clipboard.writeText(field.value).catch(fallback)
            : Promise.resolve().then(fallback);
        asked.then(() => { said.textContent = "Copied to the clipboard." },
                   () => { said.textContent = "The browser refused to copy: select the key " +
                                              "and copy it (Ctrl+C)." });
    }

    // --- revoke and rotate: asked first --------------------------------------------

    function ask(verb, name) {
        pending = { verb, name };
        $("lk-keys-confirm-text").textContent = verb === "RevokeKey"
            ? "Revoke the key " + name + "? Its next request is refused within a second; " +
              "requests in flight finish."
            : "Rotate the key " + name + "? A new key is shown once; its name, models and " +
              "limits stay.";
        $("lk-keys-grace-field").hidden = verb !== "RotateKey";
        $("lk-keys-grace").value = "0";
        $("lk-keys-confirm-yes").textContent = verb === "RevokeKey" ? "Revoke" : "Rotate";
        $("lk-keys-confirm").hidden = false;
    }

    function confirmed() {
        const { verb, name } = pending;
        pending = null;
        $("lk-keys-confirm").hidden = true;
        $("lk-keys-error").hidden = true;
        const args = verb === "RotateKey"
            ? [name, { grace: { t: "t", v: Number($("lk-keys-grace").value) } }]
            : [name];
        busy(true);
        call(verb, args)
                .then(reply => {
                    if (verb === "RotateKey")
                        showKey(name, reply[0], "new");
                })
                .catch(ex => failed(verb + " " + name, ex))
                .finally(() => {
                    busy(false);
                    refresh();
                });
    }

    // --- add -----------------------------------------------------------------------

    // AddKey's options from the form; an error naming the field it cannot read.
    function options() {
        const out = { class: { t: "s", v: $("lk-key-class").value } };
        const models = $("lk-key-models").value.split(/[\s,]+/).filter(Boolean);
        if (models.length)
            out.models = { t: "as", v: models };
        for (const [name, label] of LIMITS) {
            const text = $("lk-key-" + name).value.trim();
            if (!text)
                continue;
            if (!/^\d{1,16}$/.test(text))
                throw new Error(label + ": a whole number, not " + JSON.stringify(text));
            out[name] = { t: "t", v: Number(text) };
        }
        const day = $("lk-key-expires").value;      // YYYY-MM-DD: 00:00 UTC, as lokictl's
        if (day)
            out.expires = { t: "x", v: Date.parse(day + "T00:00:00Z") / 1000 };
        return out;
    }

    function add(ev) {
        ev.preventDefault();
        const name = $("lk-key-name").value.trim();
        $("lk-keys-error").hidden = true;
        let opts;
        try {
            opts = options();
        } catch (ex) {
            failed("AddKey " + name, ex);
            return;
        }
        busy(true);
        call("AddKey", [name, opts])
                .then(([secret]) => {
                    $("lk-keys-form").reset();
                    showKey(name, secret, "new");
                })
                .catch(ex => failed("AddKey " + name, ex))
                .finally(() => {
                    busy(false);
                    refresh();
                });
    }

    function closeKey() {
        $("lk-key-once-value").value = "";
        if ($("lk-key-once").open)
            $("lk-key-once").close();
    }

    $("lk-keys-form").addEventListener("submit", add);
    $("lk-keys-confirm-yes").addEventListener("click", confirmed);
    $("lk-keys-confirm-no").addEventListener("click", () => {
        pending = null;
        $("lk-keys-confirm").hidden = true;
    });
    $("lk-key-once-copy").addEventListener("click", copyKey);
    $("lk-key-once-close").addEventListener("click", closeKey);
    $("lk-key-once").addEventListener("close", closeKey);   // Escape too
    client.subscribe({ path: PATH, interface: KEYS, member: "KeysChanged" }, refresh);
    cockpit.addEventListener("locationchanged", refresh);
    refresh();
}());
