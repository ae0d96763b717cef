"""lokid.core.serve.keys: the named keys' file, the lookup by hash, the headers a key is read
from."""

from __future__ import annotations

import pytest

from lokid.core.errors import ConfigError
from lokid.core.serve import keys

NOW = 1_800_000_000.0


def entry_text(name: str, secret: str, extra: str = "") -> str:
    return f'[keys.{name}]\nhash = "{keys.digest(secret)}"\n{extra}'


def test_a_new_secret_is_long_random_and_only_its_digest_is_stored() -> None:
    a, b = keys.new_secret(), keys.new_secret()
    assert a != b and a.startswith(keys.KEY_PREFIX) and len(a) >= len(keys.KEY_PREFIX) + 43
    text = entry_text("alice", a)
    assert a not in text and a[len(keys.KEY_PREFIX):] not in text
    entries = keys.parse(text)
    ident, why = keys.Lookup(entries.values()).find(a, NOW)
    assert ident is not None and ident.name == "alice" and why == ""


@pytest.mark.parametrize("headers,expected", [
    ({"Authorization": "Bearer sk-1"}, "sk-1"),
    ({"Authorization": "bearer   sk-1 "}, "sk-1"),
    ({"Authorization": "sk-1"}, "sk-1"),              # bare, as llama-server takes it
    ({"x-api-key": "sk-1"}, "sk-1"),                   # Anthropic's clients
    ({"Authorization": "Bearer"}, "Bearer"),           # no key after the scheme: as given
    ({}, None),
    ({"Authorization": "  ", "x-api-key": ""}, None),
])
def test_the_key_is_read_where_clients_put_it(headers: dict[str, str],
                                               expected: str | None) -> None:
    assert keys.presented(headers) == expected


def test_scopes_classes_and_limits_are_read() -> None:
    text = entry_text("batchbot", "k1", 'class = "batch"\nmodels = ["qwen*", "llama3"]\n'
                      "max_in_flight = 3\nrequests_per_minute = 60\ntokens_per_day = 1000\n")
    ident = keys.parse(text)["batchbot"].identity
    assert ident.batch and ident.limits.max_in_flight == 3
    assert ident.limits.as_dict() == {"max_in_flight": 3, "requests_per_minute": 60,
                                      "tokens_per_day": 1000}
    assert ident.allows("qwen-7b") and ident.allows("llama3")
    assert not ident.allows("llama3-70b") and not ident.allows("QWEN-7b")
    everything = keys.parse(entry_text("all", "k2", 'models = ["*"]\n'))["all"].identity
    assert everything.models == () and everything.allows("anything")


def test_revoked_expired_and_rotated_keys_are_refused_with_their_reason() -> None:
    text = (entry_text("gone", "k-gone", "revoked = 2026-01-01T00:00:00Z\n")
            + entry_text("old", "k-old", "expires = 2026-01-01T00:00:00Z\n")
            + entry_text("rot", "k-new", f'previous_hash = "{keys.digest("k-prev")}"\n'
                         "previous_until = 2027-01-01T00:00:00Z\n"))
    lookup = keys.Lookup(keys.parse(text).values())
    assert lookup.find("k-gone", NOW) == (None, "key 'gone' was revoked")
    assert lookup.find("k-old", NOW) == (None, "key 'old' has expired")
    until = keys.parse(text)["rot"].previous_until
    assert until is not None
    grace = until - 1
    assert lookup.find("k-prev", grace)[0] is not None       # within its grace
    assert lookup.find("k-prev", grace + 2)[0] is None        # after it
    assert "rotated" in lookup.find("k-prev", grace + 2)[1]
    assert lookup.find("k-new", NOW)[0] is not None
    assert lookup.find("nobody's", NOW) == (None, "")


def test_the_flat_keys_file_keeps_working_under_a_name_that_is_not_the_key() -> None:
    lookup = keys.Lookup((), ["sk-legacy-1", "sk-legacy-2"])
    one, _ = lookup.find("sk-legacy-1", NOW)
    two, _ = lookup.find("sk-legacy-2", NOW)
    assert one is not None and two is not None and one.name != two.name
    assert one.name.startswith(keys.LEGACY_PREFIX) and "legacy" not in one.name
    assert one.allows("any-model") and not one.batch and one.limits == keys.Limits()


@pytest.mark.parametrize("text,where", [
    ('[keys.a]\nhash = "sha256:00"\n', "keys.a.hash"),
    (entry_text("a", "k") + "modles = [\"x\"]\n", "keys.a.modles"),
    (entry_text("a", "k") + 'class = "urgent"\n', "keys.a.class"),
    (entry_text("a", "k") + "max_in_flight = 0\n", "keys.a.max_in_flight"),
    (entry_text("a", "k") + 'max_in_flight = "3"\n', "keys.a.max_in_flight"),
    (entry_text("a", "k") + 'expires = "tomorrow"\n', "keys.a.expires"),
    (entry_text("a", "k") + 'models = [""]\n', "keys.a.models"),
    ('[keys."-bad"]\nhash = "x"\n', "keys"),
    ('[keys]\na = 1\n', "keys"),
    ('[other]\n', "other"),
    (entry_text("a", "same") + entry_text("b", "same"), "same hash"),
    ("[keys.a\n", "TOML syntax"),
])
def test_a_fault_is_an_error_naming_where_never_a_wider_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as e:
        keys.parse(text, "/etc/loki/clients/keys.toml")
    assert where in str(e.value) and "/etc/loki/clients/keys.toml" in str(e.value)


def test_a_runaway_file_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(ConfigError, match="over"):
        keys.parse("#" * (keys.MAX_KEYS_BYTES + 1))


def test_a_thousand_keys_are_found_by_one_hash_not_a_loop() -> None:
    secrets = [keys.new_secret() for _ in range(1000)]
    text = "".join(entry_text(f"user{i}", s) for i, s in enumerate(secrets))
    lookup = keys.Lookup(keys.parse(text).values())
    assert len(lookup) == 1000
    assert lookup.find(secrets[999], NOW)[0].name == "user999"  # type: ignore[union-attr]
    # the lookup is a dictionary keyed by the digest: what a guess costs does not
    # depend on how many keys there are, nor on how much of one it got right
    assert set(lookup.by_hash) == {keys.digest(s) for s in secrets}


def test_names_follow_one_rule() -> None:
    assert keys.valid_name("alice") and keys.valid_name("team.ml@lab-1")
    for bad in ("", "-x", "a b", "a/b", "x" * 65, "é"):
        assert not keys.valid_name(bad)
