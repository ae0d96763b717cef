/*
 * The page's router, loaded last: Cockpit keeps the page's location in the
 * shell's URL (cockpit.location), so #/ is the overview and #/preset/NAME a
 * preset's view, a link to either can be shared, and Back works.
 */
"use strict";

(function () {
    const { $ } = lokid;

    function route() {
        const path = cockpit.location.path;
        if (path[0] === "preset" && path[1]) {
            $("lk-overview").hidden = true;
            $("lk-devices").hidden = true;
            $("lk-preset").hidden = false;
            lokid.showPreset(path[1]);
        } else {
            lokid.hidePreset();
            $("lk-preset").hidden = true;
            $("lk-overview").hidden = false;
            lokid.renderOverview();
            lokid.renderDevices();
        }
    }

    $("lk-alert-close").addEventListener("click", lokid.clearError);
    cockpit.addEventListener("locationchanged", route);
    route();
}());
