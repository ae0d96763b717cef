-- The state DB as release 0.1.0 left it (schema 3): made by that release's own
-- lokid/engine/state.py (commit 40a42a5, kept beside this file as state_py.txt) with a token,
-- a failure verdict, a bench result and a learned effort, then dumped by sqlite3's iterdump.
BEGIN TRANSACTION;
CREATE TABLE attempt (
        preset  TEXT PRIMARY KEY,
        mark    TEXT NOT NULL,
        since   REAL NOT NULL
    );
INSERT INTO "attempt" VALUES('demo','fp-demo|/usr/bin/llama-server|11434',1.79617164679730796812e+09);
CREATE TABLE bench (
        preset       TEXT PRIMARY KEY,
        result       TEXT NOT NULL,
        model        TEXT NOT NULL,
        engine       TEXT NOT NULL,
        fingerprint  TEXT NOT NULL,
        at           REAL NOT NULL
    );
INSERT INTO "bench" VALUES('demo','{"decode_tps": 42.5, "protocol": 2}','tiny.gguf','b11434','fp-demo',1764633600.0);
CREATE TABLE bench_last (
        id      INTEGER PRIMARY KEY CHECK (id = 1),
        preset  TEXT NOT NULL,
        result  TEXT NOT NULL,
        at      REAL NOT NULL
    );
CREATE TABLE effort (
        model   TEXT NOT NULL,
        wanted  TEXT NOT NULL,
        used    TEXT NOT NULL,
        PRIMARY KEY (model, wanted)
    );
INSERT INTO "effort" VALUES('tiny.gguf','high','');
CREATE TABLE failed (
        preset  TEXT NOT NULL,
        mark    TEXT NOT NULL,
        reason  TEXT NOT NULL,
        at      REAL NOT NULL,
        PRIMARY KEY (preset, mark)
    );
INSERT INTO "failed" VALUES('qwen','fp-qwen|/usr/bin/llama-server|11434','the last automatic launch never answered',1.79617164679746222494e+09);
COMMIT;
PRAGMA user_version = 3;
