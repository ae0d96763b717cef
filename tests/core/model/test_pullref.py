"""The pull's pure rules (lokid.core.model.pullref, issue 48): references read and refused, the
hub's listing read and refused, the files chosen from listings written as the hub returns
them (a bartowski-style repository, an unsloth-style one with projectors, a split model in
a subdirectory), and the URLs built with awkward characters."""

from __future__ import annotations

import hashlib

import pytest

from lokid.core.errors import HubError, PullReferenceError
from lokid.core.model.pullref import (
    DEFAULT_ENDPOINT,
    HubFile,
    PullFile,
    PullPlan,
    Reference,
    _plan,
    choose_files,
    endpoint_from,
    parse_listing,
    parse_reference,
    resolve_url,
    tree_url,
    url_plan,
)

GIB = 1 << 30


def lfs(path: str, size: int = GIB) -> dict[str, object]:
    """A tree entry of an LFS file as the hub lists it (its oid: a fake SHA-256)."""
    sha = hashlib.sha256(path.encode()).hexdigest()
    return {"type": "file", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 134,
            "path": path, "lfs": {"oid": sha, "size": size, "pointerSize": 134}}


def plain(path: str, size: int = 1519) -> dict[str, object]:
    return {"type": "file", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": size,
            "path": path}


def directory(path: str) -> dict[str, object]:
    return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
            "path": path}


BARTOWSKI_QUANTS = ["IQ2_M", "IQ3_M", "IQ4_XS", "Q2_K", "Q2_K_L", "Q3_K_L", "Q3_K_M",
                    "Q4_0", "Q4_0_4_4", "Q4_K_L", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S",
                    "Q6_K", "Q6_K_L", "Q8_0", "f16"]
BARTOWSKI = parse_listing(
    [plain(".gitattributes"), plain("README.md", 21000)]
    + [lfs(f"Llama-3.2-3B-Instruct-{q}.gguf") for q in BARTOWSKI_QUANTS]
    + [lfs("Llama-3.2-3B-Instruct.imatrix", 3 << 20)])
UNSLOTH = parse_listing([
    plain(".gitattributes"), plain("README.md"), plain("params"), directory("BF16"),
    lfs("BF16/gemma-3-27b-it-BF16-00001-of-00002.gguf"),
    lfs("BF16/gemma-3-27b-it-BF16-00002-of-00002.gguf"),
    lfs("gemma-3-27b-it-Q4_K_M.gguf"), lfs("gemma-3-27b-it-UD-Q4_K_M.gguf"),
    lfs("gemma-3-27b-it-UD-Q4_K_XL.gguf"), lfs("gemma-3-27b-it-Q8_0.gguf"),
    lfs("mmproj-BF16.gguf", 800 << 20), lfs("mmproj-F16.gguf", 800 << 20),
    lfs("mmproj-F32.gguf", 1600 << 20)])
SPLIT = parse_listing([
    plain(".gitattributes"), directory("Q8_0"),
    lfs("Q8_0/Qwen3-235B-A22B-Q8_0-00003-of-00003.gguf", 40 * GIB),
    lfs("Q8_0/Qwen3-235B-A22B-Q8_0-00001-of-00003.gguf", 46 * GIB),
    lfs("Q8_0/Qwen3-235B-A22B-Q8_0-00002-of-00003.gguf", 46 * GIB),
    directory("Q4_K_M"),
    lfs("Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf", 46 * GIB),
    lfs("Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00003-of-00003.gguf", 40 * GIB)])


def names(plan: PullPlan) -> list[tuple[str, str]]:
    return [(f.name, f.role) for f in plan.files]


# --- references ---------------------------------------------------------------------------

VALID = [
    ("bartowski/Llama-3.2-3B-Instruct-GGUF", Reference("bartowski/Llama-3.2-3B-Instruct-GGUF",
                                                       None, None, None)),
    ("  org/name:Q4_K_M\n", Reference("org/name", "Q4_K_M", None, None)),
    ("org/name:ud-q4_k_xl", Reference("org/name", "ud-q4_k_xl", None, None)),
    ("org/name@v1.2", Reference("org/name", None, None, None, "v1.2")),
    ("org/name@refs/pr/7:Q8_0", Reference("org/name", "Q8_0", None, None, "refs/pr/7")),
    ("org/name@" + "a" * 40, Reference("org/name", None, None, None, "a" * 40)),
    ("org/name/sub/x-Q4_K_M.gguf", Reference("org/name", None, "sub/x-Q4_K_M.gguf", None)),
    ("org/name/x.GGUF@dev", Reference("org/name", None, "x.GGUF", None, "dev")),
    ("org/name/a@b:c.gguf", Reference("org/name", None, "a@b:c.gguf", None)),
    ("https://example.com/m/x%20y.gguf?download=true",
     Reference(None, None, None, "https://example.com/m/x%20y.gguf?download=true")),
    ("http://10.0.0.2:8080/x.gguf", Reference(None, None, None, "http://10.0.0.2:8080/x.gguf")),
    ("https://[::1]:443/x.gguf", Reference(None, None, None, "https://[::1]:443/x.gguf")),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_a_valid_reference_is_read_and_typed_back_the_same(text: str,
                                                           expected: Reference) -> None:
    ref = parse_reference(text)
    assert ref == expected
    assert parse_reference(str(ref)) == ref


def test_the_main_revision_is_not_typed_back() -> None:
    assert str(parse_reference("org/name@main:Q8_0")) == "org/name:Q8_0"


HOSTILE = [
    ("", "it is empty"),
    ("   ", "it is empty"),
    ("org", "org/name"),
    ("../x", "'..' is not a repository's org or name"),
    ("org/..", "'..' is not a repository's org or name"),
    ("org/.hidden", "'.hidden' is not"),
    ("org/a..b", "no .."),
    ("-org/name", "'-org' is not"),
    ("org/" + "n" * 97, "is not a repository's org or name"),
    ("org/repo/../../etc/passwd.gguf", "'../../etc/passwd.gguf' is not one lokid fetches"),
    ("org/repo/./x.gguf", ". or .. segment"),
    ("org/repo//x.gguf", "starts with /"),
    ("org/repo/a//x.gguf", "empty"),
    ("org/repo/a\\b.gguf", "backslash"),
    ("org/repo/x.bin", "does not end in .gguf"),
    ("org/repo/sub", "does not end in .gguf"),
    ("org/re\x1bpo", "\\u001b"),
    ("org/repo:Q4\x00", "\\u0000"),
    ("org/repo\u0085x", "\\u0085"),
    ("org/repo/x.gguf:Q4_K_M", "a tag does not go with a file path"),
    ("org/repo:", "the tag ''"),
    ("org/repo:Q4 K", "the tag 'Q4 K'"),
    ("org/repo@", "the revision ''"),
    ("org/repo@a..b", "the revision 'a..b'"),
    ("org/repo@/main", "the revision '/main'"),
    ("org/repo@x y", "the revision 'x y'"),
    ("org/repo:Q4@rev", "'repo:Q4' is not"),
    ("https://user:pw@host/x.gguf", "user name or password"),
    ("https://token@host/x.gguf", "user name or password"),
    ("file:///etc/passwd.gguf", "only https:// and http://"),
    ("FILE:/etc/x.gguf", "only https:// and http://"),
    ("ftp://host/x.gguf", "only https:// and http://"),
    ("https:/host/x.gguf", "only https:// and http://"),
    ("https://host", "only https:// and http://"),
    ("https://host/x.gguf#frag", "#fragment"),
    ("https://host/a b.gguf", "%20"),
    ("https://host:0/x.gguf", "not a host name"),
    ("https://host:70000/x.gguf", "not a host name"),
    ("https://ho_st/x.gguf", "not a host name"),
    ("https://host/", "its file name ''"),
    ("https://host/x.bin", "does not end in .gguf"),
    ("https://host/%2e%2e/x.gguf", ". or .. segment"),
    ("https://host/%zz.gguf", "bad %-escape"),
    ("https://host/a%2Fb.gguf", "'a/b.gguf'"),
    ("https://host/.x.gguf", "'.x.gguf'"),
    ("https://host/%0a.gguf", "control"),
    ("org/" + "x" * 3000, "longer than 2048"),
]


@pytest.mark.parametrize(("text", "why"), HOSTILE)
def test_a_bad_reference_is_refused_saying_what_was_given_and_the_valid_forms(
        text: str, why: str) -> None:
    with pytest.raises(PullReferenceError) as caught:
        parse_reference(text)
    message = str(caught.value)
    assert why in message
    assert "org/name:TAG" in message and "https://" in message
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in message)
    assert len(message) < 1000


def test_the_refused_text_is_shown_escaped() -> None:
    with pytest.raises(PullReferenceError, match=r"'org/x\\\\u001b\[2Jy'"):
        parse_reference("org/x\x1b[2Jy")


# --- the hub's listing -----------------------------------------------------------------

def test_a_listing_keeps_files_with_their_lfs_size_and_digest() -> None:
    entry = lfs("sub/a.gguf", 5 * GIB)
    entry["lfs"]["oid"] = "AB" * 32    # type: ignore[index]
    files = parse_listing([directory("sub"), entry, plain("README.md", 77)])
    assert files == [HubFile("sub/a.gguf", 5 * GIB, "ab" * 32), HubFile("README.md", 77, None)]


def test_an_empty_listing_is_no_file() -> None:
    assert parse_listing([]) == []


MALFORMED = [
    {"error": "Repository not found"},
    "<html>mirror</html>",
    None,
    [["file", "a.gguf"]],
    [{"path": "a.gguf", "size": 1}],
    [{"type": "file", "path": "a.gguf"}],
    [{"type": "file", "path": "a.gguf", "size": "12"}],
    [{"type": "file", "path": "a.gguf", "size": True}],
    [{"type": "file", "path": "a.gguf", "size": -1}],
    [{"type": "file", "path": "a.gguf", "size": 1.5}],
    [{"type": "file", "path": 7, "size": 1}],
    [{"type": "file", "path": "", "size": 1}],
    [{"type": "file", "path": "a.gguf", "size": 1, "lfs": "x"}],
    [{"type": "file", "path": "a.gguf", "size": 1, "lfs": {"oid": "ab" * 31, "size": 1}}],
    [{"type": "file", "path": "a.gguf", "size": 1, "lfs": {"oid": "zz" * 32, "size": 1}}],
    [{"type": "file", "path": "a.gguf", "size": 1, "lfs": {"oid": "ab" * 32}}],
    [{"type": "file", "path": "a.gguf", "size": 1, "lfs": {"oid": "ab" * 32, "size": None}}],
]


@pytest.mark.parametrize("listing", MALFORMED)
def test_a_listing_not_shaped_as_the_hubs_is_refused_whole(listing: object) -> None:
    with pytest.raises(HubError, match="the hub's file listing is not what lokid reads") as e:
        parse_listing([lfs("good.gguf"), *listing] if isinstance(listing, list) else listing)
    assert e.value.retry is False


# --- choosing: a bartowski-style repository ---------------------------------------------

@pytest.mark.parametrize(("tag", "chosen"), [
    (None, "Q4_K_M"), ("Q4_K_M", "Q4_K_M"), ("q4_k_m", "Q4_K_M"), ("Q4_0", "Q4_0"),
    ("Q4_0_4_4", "Q4_0_4_4"), ("Q2_K", "Q2_K"), ("Q2_K_L", "Q2_K_L"), ("F16", "f16"),
    ("IQ4_XS", "IQ4_XS"), ("Q6_K", "Q6_K"),
])
def test_a_tag_takes_the_file_of_that_quantisation_only(tag: str | None, chosen: str) -> None:
    ref = parse_reference("bartowski/Llama-3.2-3B-Instruct-GGUF" + (f":{tag}" if tag else ""))
    plan = choose_files(ref, BARTOWSKI)
    name = f"Llama-3.2-3B-Instruct-{chosen}.gguf"
    assert plan.files == (PullFile(name, name, GIB, hashlib.sha256(name.encode()).hexdigest(),
                                   "model"),)
    assert plan.model_name == name and plan.total == GIB and plan.reference == ref


@pytest.mark.parametrize("tag", ["Q4_K", "Q4", "BF16", "Q8", "XS_IQ4", "IQ4_X"])
def test_a_tag_that_is_only_part_of_a_quantisation_matches_nothing(tag: str) -> None:
    with pytest.raises(PullReferenceError) as caught:
        choose_files(parse_reference(f"bartowski/Llama-3.2-3B-Instruct-GGUF:{tag}"), BARTOWSKI)
    message = str(caught.value)
    assert f"no model file for the tag {tag};" in message
    assert "tags offered: F16, IQ2_M, IQ3_M, IQ4_XS, Q2_K, Q2_K_L" in message
    assert "Q4_K_M" in message and "Q8_0" in message


def test_a_tag_naming_several_files_is_refused_naming_them() -> None:
    with pytest.raises(PullReferenceError,
                       match="the tag K_M names several models: Llama-3.2-3B-Instruct-Q3_K_M"
                             r"\.gguf, Llama-3.2-3B-Instruct-Q4_K_M\.gguf, Llama-3.2-3B-"
                             r"Instruct-Q5_K_M\.gguf; give a longer tag"):
        choose_files(parse_reference("bartowski/Llama-3.2-3B-Instruct-GGUF:K_M"), BARTOWSKI)


def test_a_refusal_lists_at_most_ten_names() -> None:
    listing = parse_listing([lfs(f"m-{i:02d}-Q4_K_M.gguf") for i in range(25)])
    with pytest.raises(PullReferenceError, match=r"m-09-Q4_K_M\.gguf and 15 more;") as e:
        choose_files(parse_reference("o/n"), listing)
    assert "m-10-" not in str(e.value)


def test_without_q4_k_m_the_default_is_q8_0() -> None:
    listing = parse_listing([lfs("m-Q2_K.gguf"), lfs("m-Q8_0.gguf"), lfs("m-F16.gguf")])
    assert names(choose_files(parse_reference("o/n"), listing)) == [("m-Q8_0.gguf", "model")]


def test_without_a_default_tag_the_only_model_is_taken() -> None:
    listing = parse_listing([lfs("model.gguf"), plain("README.md")])
    assert names(choose_files(parse_reference("o/n"), listing)) == [("model.gguf", "model")]


def test_without_a_default_tag_several_models_are_refused_with_their_tags() -> None:
    listing = parse_listing([lfs("m-Q2_K.gguf"), lfs("m-F16.gguf"), lfs("other.gguf")])
    with pytest.raises(PullReferenceError,
                       match=r"several models and no tag was given .*tags offered: F16, Q2_K; "
                             r"files without a tag \(pull them by path\): other\.gguf; pull "
                             r"one as o/n:TAG"):
        choose_files(parse_reference("o/n"), listing)


def test_a_repository_without_a_model_is_refused() -> None:
    listing = parse_listing([plain("README.md"), lfs("model.safetensors"), lfs("mmproj-F16.gguf")])
    with pytest.raises(PullReferenceError, match="o/n holds no GGUF model file"):
        choose_files(parse_reference("o/n"), listing)


# --- choosing: an unsloth-style repository with projectors ------------------------------

@pytest.mark.parametrize(("tag", "model", "projector"), [
    (None, "gemma-3-27b-it-Q4_K_M.gguf", "mmproj-F16.gguf"),
    ("Q4_K_M", "gemma-3-27b-it-Q4_K_M.gguf", "mmproj-F16.gguf"),
    ("UD-Q4_K_M", "gemma-3-27b-it-UD-Q4_K_M.gguf", "mmproj-F16.gguf"),
    ("Q4_K_XL", "gemma-3-27b-it-UD-Q4_K_XL.gguf", "mmproj-F16.gguf"),
    ("Q8_0", "gemma-3-27b-it-Q8_0.gguf", "mmproj-F16.gguf"),
])
def test_a_model_comes_with_its_projector(tag: str | None, model: str, projector: str) -> None:
    plan = choose_files(parse_reference("unsloth/gemma-3-27b-it-GGUF"
                                        + (f":{tag}" if tag else "")), UNSLOTH)
    assert names(plan) == [(model, "model"), (projector, "mmproj")]
    assert plan.model_name == model and plan.total == GIB + (800 << 20)


def test_a_projector_of_the_tag_comes_first_and_the_split_model_whole() -> None:
    plan = choose_files(parse_reference("unsloth/gemma-3-27b-it-GGUF:bf16"), UNSLOTH)
    assert names(plan) == [("gemma-3-27b-it-BF16-00001-of-00002.gguf", "model"),
                           ("gemma-3-27b-it-BF16-00002-of-00002.gguf", "model"),
                           ("mmproj-BF16.gguf", "mmproj")]
    assert plan.files[0].path == "BF16/gemma-3-27b-it-BF16-00001-of-00002.gguf"


@pytest.mark.parametrize(("projectors", "chosen"), [
    (["mmproj-Q8_0.gguf", "mmproj-F32.gguf", "mmproj-BF16.gguf", "mmproj-F16.gguf"],
     "mmproj-F16.gguf"),
    (["mmproj-Q8_0.gguf", "mmproj-F32.gguf", "mmproj-BF16.gguf"], "mmproj-BF16.gguf"),
    (["mmproj-Q8_0.gguf", "mmproj-F32.gguf"], "mmproj-F32.gguf"),
    (["mmproj-Q4_0.gguf", "mmproj-Q8_0.gguf"], "mmproj-Q8_0.gguf"),
    (["z/mmproj-b.gguf", "a/mmproj-c.gguf"], "mmproj-c.gguf"),
    (["mmproj-model-f16.gguf", "mmproj-Q2_K.gguf"], "mmproj-Q2_K.gguf"),   # the tag's own
    (["MMPROJ-BF16.GGUF"], "MMPROJ-BF16.GGUF"),
])
def test_the_projector_is_the_tags_then_f16_bf16_f32_q8_0_then_the_first(
        projectors: list[str], chosen: str) -> None:
    listing = parse_listing([lfs("m-Q2_K.gguf"), *(lfs(p) for p in projectors)])
    plan = choose_files(parse_reference("o/n:Q2_K"), listing)
    assert names(plan) == [("m-Q2_K.gguf", "model"), (chosen, "mmproj")]


def test_an_explicit_path_fetches_that_file_without_a_projector() -> None:
    plan = choose_files(parse_reference("unsloth/gemma-3-27b-it-GGUF/gemma-3-27b-it-Q8_0.gguf"),
                        UNSLOTH)
    assert names(plan) == [("gemma-3-27b-it-Q8_0.gguf", "model")]


def test_a_path_that_differs_in_case_is_refused_with_the_right_spelling() -> None:
    with pytest.raises(PullReferenceError,
                       match=r"has no file Gemma-3-27b-it-Q8_0\.gguf; did you mean "
                             r"gemma-3-27b-it-Q8_0\.gguf\?"):
        choose_files(parse_reference("o/n/Gemma-3-27b-it-Q8_0.gguf"), UNSLOTH)


def test_a_path_not_listed_is_refused_with_the_files_there_are() -> None:
    with pytest.raises(PullReferenceError, match=r"o/n at revision v2 has no file x\.gguf; "
                                                 r"its GGUF files: BF16/gemma"):
        choose_files(parse_reference("o/n/x.gguf@v2"), UNSLOTH)


# --- choosing: split models --------------------------------------------------------------

def test_a_split_model_in_a_subdirectory_comes_whole_and_in_order() -> None:
    plan = choose_files(parse_reference("unsloth/Qwen3-235B-A22B-GGUF:Q8_0"), SPLIT)
    stem = "Qwen3-235B-A22B-Q8_0"
    assert [(f.path, f.name) for f in plan.files] == [
        (f"Q8_0/{stem}-0000{k}-of-00003.gguf", f"{stem}-0000{k}-of-00003.gguf")
        for k in (1, 2, 3)]
    assert plan.total == 132 * GIB and plan.model_name == f"{stem}-00001-of-00003.gguf"
    assert all(f.sha256 and len(f.sha256) == 64 for f in plan.files)


def test_a_tag_naming_only_the_directory_takes_its_shards() -> None:
    listing = parse_listing([lfs("Q8_0/model-00002-of-00002.gguf"),
                             lfs("Q8_0/model-00001-of-00002.gguf"), lfs("F16/model.gguf")])
    plan = choose_files(parse_reference("o/n"), listing)
    assert names(plan) == [("model-00001-of-00002.gguf", "model"),
                           ("model-00002-of-00002.gguf", "model")]


def test_a_path_to_any_shard_takes_the_whole_set() -> None:
    plan = choose_files(parse_reference(
        "o/n/Q8_0/Qwen3-235B-A22B-Q8_0-00002-of-00003.gguf"), SPLIT)
    assert [f.name for f in plan.files] == [f"Qwen3-235B-A22B-Q8_0-0000{k}-of-00003.gguf"
                                            for k in (1, 2, 3)]


@pytest.mark.parametrize("ref", ["o/n:Q4_K_M", "o/n",
                                 "o/n/Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00003-of-00003.gguf"])
def test_a_split_with_a_shard_missing_is_refused(ref: str) -> None:
    with pytest.raises(PullReferenceError,
                       match=r"Q4_K_M/Qwen3-235B-A22B-Q4_K_M-\*-of-00003\.gguf \(3 shards\): "
                             "shard 2 of 3 missing from the repository"):
        choose_files(parse_reference(ref), SPLIT)


def test_two_shard_sets_for_one_tag_are_two_models() -> None:
    listing = parse_listing([lfs(f"a/m-Q8_0-0000{k}-of-00002.gguf") for k in (1, 2)]
                            + [lfs(f"b/m-Q8_0-0000{k}-of-00002.gguf") for k in (1, 2)])
    with pytest.raises(PullReferenceError, match=r"names several models: a/m-Q8_0-\*-of-00002"
                                                 r"\.gguf \(2 shards\), b/m-Q8_0-\*"):
        choose_files(parse_reference("o/n:Q8_0"), listing)


# --- choosing: what a hub may not make lokid write ---------------------------------------

@pytest.mark.parametrize("path", ["../../etc/x-Q8_0.gguf", "a/./x-Q8_0.gguf",
                                  ".x-Q8_0.gguf", "a\\x-Q8_0.gguf", "x-Q8_0\n.gguf"])
def test_a_listed_file_lokid_would_not_write_is_refused(path: str) -> None:
    listing = parse_listing([lfs(path)])
    with pytest.raises(HubError, match="a file lokid will not write"):
        choose_files(parse_reference("o/n:Q8_0"), listing)


def test_two_files_of_one_name_are_refused() -> None:
    # Today's selection never picks two (a projector's name holds "mmproj", a model's does
    # not, and one split is one directory): the guard is for a rule that picks more.
    a, b = HubFile("a/m.gguf", 1, None), HubFile("b/m.gguf", 1, None)
    with pytest.raises(PullReferenceError, match="a/m.gguf and b/m.gguf would both be m.gguf"):
        _plan(parse_reference("o/n"), [(a, "model"), (b, "mmproj")], "o/n")


# --- URLs -----------------------------------------------------------------------------

def test_a_url_plan_is_one_file_of_unknown_size() -> None:
    ref = parse_reference("https://example.com/models/my%20model%23v2.gguf?download=true")
    plan = url_plan(ref)
    assert plan.files == (PullFile("/models/my%20model%23v2.gguf", "my model#v2.gguf", None,
                                   None, "model"),)
    assert plan.total is None and plan.model_name == "my model#v2.gguf"
    assert choose_files(ref, []) == plan


def test_a_url_reference_made_by_hand_meets_the_same_rules() -> None:
    with pytest.raises(PullReferenceError, match="user name or password"):
        url_plan(Reference(None, None, None, "https://u:p@host/x.gguf"))
    with pytest.raises(PullReferenceError, match="is not a URL"):
        url_plan(parse_reference("o/n"))


def test_the_tree_url_encodes_the_revision_whole() -> None:
    assert (tree_url(DEFAULT_ENDPOINT, "org/name", "refs/pr/1")
            == "https://huggingface.co/api/models/org/name/tree/refs%2Fpr%2F1?recursive=true")
    assert (tree_url("http://mirror:8080/hf", "o/n", "main")
            == "http://mirror:8080/hf/api/models/o/n/tree/main?recursive=true")


@pytest.mark.parametrize(("path", "encoded"), [
    ("a b.gguf", "a%20b.gguf"),
    ("sub/x#1.gguf", "sub/x%231.gguf"),
    ("what?.gguf", "what%3F.gguf"),
    ("a%20b.gguf", "a%2520b.gguf"),
    ("Q4_K_M/m-00001-of-00002.gguf", "Q4_K_M/m-00001-of-00002.gguf"),
    ("modèle+x&y=1;.gguf", "mod%C3%A8le%2Bx%26y%3D1%3B.gguf"),
    ("a:b@c~d.gguf", "a%3Ab%40c~d.gguf"),
])
def test_the_resolve_url_encodes_each_segment(path: str, encoded: str) -> None:
    assert (resolve_url(DEFAULT_ENDPOINT, "org/name", "refs/pr/1", path)
            == f"https://huggingface.co/org/name/resolve/refs%2Fpr%2F1/{encoded}")


@pytest.mark.parametrize(("value", "endpoint"), [
    (None, "https://huggingface.co"),
    ("", "https://huggingface.co"),
    ("  ", "https://huggingface.co"),
    ("https://hf-mirror.com", "https://hf-mirror.com"),
    ("https://hf-mirror.com/", "https://hf-mirror.com"),
    ("HTTP://mirror.lan:8080/hf/", "http://mirror.lan:8080/hf"),
    ("http://[fd00::1]:3000", "http://[fd00::1]:3000"),
])
def test_an_endpoint_is_read_without_its_trailing_slash(value: str | None,
                                                        endpoint: str) -> None:
    assert endpoint_from(value) == endpoint


@pytest.mark.parametrize("value", [
    "hf-mirror.com", "ftp://mirror", "file:///srv/hf", "https://", "https://user:pw@mirror",
    "https://mirror/hf?x=1", "https://mirror/#x", "https://mirror/../x", "https://mirror/a b",
    "https://mirror:99999", "https://mir\nror", "https://mir ror",
])
def test_an_endpoint_lokid_cannot_use_is_refused(value: str) -> None:
    with pytest.raises(PullReferenceError, match=r"HF_ENDPOINT .* is not a hub's address: .*use "
                                                 r"http\(s\)://host\[:port\]\[/prefix\]"):
        endpoint_from(value)
