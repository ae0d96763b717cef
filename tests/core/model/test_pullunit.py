"""The model pull's transient unit, pure (issue 48, :mod:`lokid.core.model.pullunit`): its name
and the sandbox it asks systemd for. The unit itself runs under real systemd in
tests/packaging/test_pull_systemd.py."""

from __future__ import annotations

from lokid.core.model import pullunit


def props(**kw: object) -> dict[str, tuple[str, object]]:
    args: dict[str, object] = dict(directory="/srv/models", status_dir="/run/loki/pulls",
                                   user="loki", reference="org/repo:Q4_K_M", endpoint=None,
                                   token_file=None)
    args.update(kw)
    out = pullunit.properties(["/usr/bin/python3", "-m", "lokid", "pull-worker"], **args)  # type: ignore[arg-type]
    names = [name for name, _, _ in out]
    assert len(names) == len(set(names)), names   # systemd refuses a property given twice
    return {name: (sig, value) for name, sig, value in out}


def test_one_unit_per_directory_and_reference() -> None:
    a = pullunit.unit_id("org/repo:Q4_K_M", "/srv/models")
    assert a == pullunit.unit_id("org/repo:Q4_K_M", "/srv/models")
    assert a != pullunit.unit_id("org/repo:Q8_0", "/srv/models")
    assert a != pullunit.unit_id("org/repo:Q4_K_M", "/srv/other")
    name = pullunit.unit_name(a)
    assert pullunit.is_pull_unit(name) and name.startswith("loki-pull-")
    for other in ("loki-engine@x.service", "loki-pull-../x.service", name[:-1],
                  name.replace(".service", ".socket"), "loki-pull-" + "g" * 16 + ".service",
                  "dbus.service"):
        assert not pullunit.is_pull_unit(other), other


def test_the_unit_writes_only_its_directory_and_runs_as_loki_without_capabilities() -> None:
    p = props()
    assert p["User"] == ("s", "loki") and p["Group"] == ("s", "loki")
    assert p["ProtectSystem"] == ("s", "strict")
    assert p["ReadWritePaths"] == ("as", ["/srv/models", "/run/loki/pulls"])
    assert p["CapabilityBoundingSet"] == ("t", 0)
    assert p["NoNewPrivileges"] == ("b", True)
    # lists, not tuples: Debian 12's dbus-fast 1.84 refuses a tuple for a struct
    assert p["RestrictAddressFamilies"] == ("(bas)", [True, ["AF_INET", "AF_INET6", "AF_UNIX"]])
    sig, execs = p["ExecStart"]
    assert sig == "a(sasb)" and execs == [["/usr/bin/python3", ["/usr/bin/python3", "-m",
                                                                "lokid", "pull-worker"], False]]
    assert "Environment" not in p and "LoadCredential" not in p


def test_the_token_is_a_credential_and_the_mirror_is_passed_on() -> None:
    p = props(endpoint="https://mirror.example/hf", token_file="/etc/loki/hf-token")
    assert p["LoadCredential"] == ("a(ss)", [["hf-token", "/etc/loki/hf-token"]])
    assert p["Environment"] == ("as", ["HF_ENDPOINT=https://mirror.example/hf"])
    # never the token's content anywhere: only its path
    assert all("hf_" not in str(v) for _, v in p.values())
