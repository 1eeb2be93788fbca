"""Run-file schema and migrations.

The run file is the contract between the agent (writer) and every reader. Its version lives in
``PRAGMA user_version``; each migration moves a file one version up and is recorded in the
``migrations`` table so a file says how it got to where it is.
"""

from __future__ import annotations

import functools
import sqlite3
import time

SCHEMA_VERSION = 13
APPLICATION_ID = 0x4D454D53  # "MEMS": lets a reader tell a run file from any other SQLite file


class RunFileError(Exception):
    """A run file that cannot be used: missing, not a run, corrupt or too new."""


_V1 = """
CREATE TABLE run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    command TEXT NOT NULL,          -- JSON list, as the user typed it
    cwd TEXT,
    host TEXT,
    memscope_version TEXT,
    started REAL NOT NULL,          -- unix seconds
    ended REAL,
    exit_code INTEGER,
    signal INTEGER,
    status TEXT NOT NULL            -- running | finished | failed | killed
);
CREATE TABLE processes (
    id INTEGER PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT,
    rank INTEGER,
    local_rank INTEGER,
    world_size INTEGER,
    argv TEXT,                      -- JSON list
    device TEXT,                    -- cpu | cuda | cuda:N
    torch TEXT,
    python TEXT,
    options TEXT,                   -- JSON of the agent's options
    started REAL NOT NULL,
    ended REAL,
    status TEXT NOT NULL,           -- running | stopped | lost
    step_mode TEXT,                 -- optimizer | backward | manual
    samples INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE samples (
    proc INTEGER NOT NULL,
    t REAL NOT NULL,
    step INTEGER NOT NULL,          -- the step in progress when sampled
    phase TEXT,                     -- forward | backward | optimizer | other
    rss INTEGER NOT NULL
);
CREATE INDEX samples_t ON samples (proc, t);
CREATE TABLE cuda_samples (
    proc INTEGER NOT NULL,
    t REAL NOT NULL,
    device INTEGER NOT NULL,
    allocated INTEGER, allocated_peak INTEGER,
    reserved INTEGER, reserved_peak INTEGER,
    active INTEGER, active_peak INTEGER,
    inactive_split INTEGER,
    alloc_retries INTEGER,
    ooms INTEGER
);
CREATE INDEX cuda_samples_t ON cuda_samples (proc, device, t);
CREATE TABLE nvml_samples (
    proc INTEGER NOT NULL,
    t REAL NOT NULL,
    device INTEGER NOT NULL,
    used INTEGER,
    total INTEGER
);
CREATE TABLE steps (
    proc INTEGER NOT NULL,
    step INTEGER NOT NULL,
    start REAL NOT NULL,
    end REAL NOT NULL,
    peak_rss INTEGER,               -- highest RSS seen in the step (exact when it set a new high-water mark)
    peak_allocated INTEGER,         -- CUDA: highest allocated bytes in the step, summed over devices
    peak_reserved INTEGER,
    status TEXT NOT NULL DEFAULT 'ok',
    PRIMARY KEY (proc, step)
);
CREATE TABLE events (
    proc INTEGER,
    t REAL NOT NULL,
    step INTEGER,
    kind TEXT NOT NULL,             -- collector_disabled | warning | ...
    message TEXT,
    data TEXT                       -- JSON
);
CREATE TABLE migrations (
    version INTEGER PRIMARY KEY,
    applied REAL NOT NULL
);
"""


_V2 = """
CREATE TABLE layer_stats (
    proc INTEGER NOT NULL,
    step INTEGER NOT NULL,          -- a profiled step
    module TEXT NOT NULL,           -- dotted name from named_modules(); '' is the model itself
    type TEXT,                      -- the module's class name
    calls INTEGER NOT NULL,         -- forward calls with grad enabled
    saved_bytes INTEGER NOT NULL,   -- bytes saved for backward by its own forward code, by storage
    saved_tensors INTEGER NOT NULL, -- distinct storages behind saved_bytes
    output_bytes INTEGER NOT NULL,  -- bytes of its tensor outputs, summed over calls
    forward_s REAL NOT NULL,        -- time in its forward, children included
    PRIMARY KEY (proc, step, module)
);
CREATE TABLE step_breakdown (
    proc INTEGER NOT NULL,
    step INTEGER NOT NULL,          -- a profiled step
    parameters INTEGER,             -- storages of the parameters
    gradients INTEGER,              -- storages of their .grad at the end of the step
    optimizer_state INTEGER,        -- tensors in the optimizers' state
    activations INTEGER,            -- most bytes saved for backward alive at once in the step
    PRIMARY KEY (proc, step)
);
"""


_V3 = """
CREATE TABLE inventories (
    proc INTEGER NOT NULL,
    step INTEGER NOT NULL,          -- taken at the boundary that closed this step
    tensors INTEGER NOT NULL,       -- distinct live storages seen
    bytes INTEGER NOT NULL,         -- their bytes
    graph_bytes INTEGER NOT NULL,   -- saved tensors reachable only through live autograd graphs
    duration_s REAL NOT NULL,       -- time the scan took (the training waited that long)
    truncated INTEGER NOT NULL DEFAULT 0, -- 1: a bound (graph nodes, groups) cut the scan short
    PRIMARY KEY (proc, step)
);
CREATE TABLE inventory_groups (
    proc INTEGER NOT NULL,
    step INTEGER NOT NULL,
    category TEXT NOT NULL,         -- parameters | gradients | optimizer_state | activations | other
    dtype TEXT,
    shape TEXT,                     -- JSON list
    device TEXT,
    requires_grad INTEGER,
    grad_fn TEXT,                   -- class name of the grad_fn, or NULL
    count INTEGER NOT NULL,         -- distinct storages
    bytes INTEGER NOT NULL,         -- their bytes
    graph_bytes INTEGER NOT NULL    -- saved tensors kept alive by these tensors' autograd graphs
);
CREATE INDEX inventory_groups_step ON inventory_groups (proc, step);
CREATE TABLE leak_holders (
    proc INTEGER NOT NULL,
    step INTEGER NOT NULL,          -- the inventory that searched
    category TEXT NOT NULL,
    dtype TEXT,
    shape TEXT,
    device TEXT,
    requires_grad INTEGER,
    grad_fn TEXT,
    held_by TEXT,                   -- module.variable / Class.attr / instance path, or NULL
    site TEXT                       -- file:line, or NULL
);
"""


_V4 = """
ALTER TABLE layer_stats ADD COLUMN backward_s REAL;   -- time in its backward, children included (NULL: not measured)
ALTER TABLE layer_stats ADD COLUMN alloc_delta INTEGER; -- CUDA: allocated bytes after its forward minus before
ALTER TABLE layer_stats ADD COLUMN alloc_peak INTEGER;  -- CUDA: highest allocated inside its forward, minus before
ALTER TABLE leak_holders ADD COLUMN module TEXT;      -- the module whose forward produced the group's tensors, or NULL
"""


# Version 5 (issue #16, recording that survives faults): who is still writing. A reader tells a
# live run from an abandoned one by the writers' heartbeat and, on the same host, by their pids.
_V5 = """
ALTER TABLE processes ADD COLUMN heartbeat REAL;  -- unix seconds of its writer's latest stamp (about 1/s)
ALTER TABLE run ADD COLUMN owner_pid INTEGER;     -- who finishes the run: attach, or the script (memscope.start)
"""


# Version 6 (issue #12, leak verdicts): retained autograd nodes, memory at step boundaries,
# DataLoader workers
_V6 = """
-- inventories.graph_nodes: autograd nodes kept alive by live graphs (NULL: not counted);
-- inventories.full: 1 when a walk over every object found the tensors, 0 the live-tensor registry;
-- inventories.level: host RSS (CPU) or CUDA allocated bytes at that boundary
ALTER TABLE inventories ADD COLUMN graph_nodes INTEGER;
ALTER TABLE inventories ADD COLUMN full INTEGER;
ALTER TABLE inventories ADD COLUMN level INTEGER;
ALTER TABLE inventory_groups ADD COLUMN graph_nodes INTEGER; -- autograd nodes these tensors' graphs keep alive
ALTER TABLE steps ADD COLUMN end_rss INTEGER;                -- host RSS at the boundary that closed the step
ALTER TABLE steps ADD COLUMN end_allocated INTEGER;          -- CUDA allocated bytes there, summed over devices
CREATE TABLE worker_samples (
    proc INTEGER NOT NULL,          -- the training process whose child it is
    pid INTEGER NOT NULL,           -- the worker (a DataLoader worker: a child process not itself recorded)
    t REAL NOT NULL,
    uss INTEGER,                    -- unique set size: pages only this worker holds (its copies)
    pss INTEGER,                    -- proportional set size
    rss INTEGER
);
CREATE INDEX worker_samples_t ON worker_samples (proc, pid, t);
"""


# Version 7 (issue #15, layers per micro-batch): with gradient accumulation a profiled step runs
# several forwards, each followed by its backward; a layer row is one of them, not their sum
_V7 = """
-- layer_stats.micro_batches: forward passes with a backward between them in the step (1 without
-- gradient accumulation); the rows are those of the one that saved the most.
-- NULL (files before version 7): the row is summed over the step's micro-batches
ALTER TABLE layer_stats ADD COLUMN micro_batches INTEGER;
"""


# Version 8 (issue #20, leak sites): the line that kept a leaked tensor and the line that made it
# are two facts (``history.append(loss)`` in the loop; the loss made inside ``model.forward``)
_V8 = """
-- leak_holders.site: the line that stored the tensor where it is kept; created_at: where it was made
ALTER TABLE leak_holders ADD COLUMN created_at TEXT;
"""


# Version 9 (issue #20, graph-node leaks): what an autograd node costs is measured on the run
_V9 = """
-- inventories.heap: bytes glibc's malloc had handed out at the inventory (NULL: not glibc);
-- the retained nodes' cost a node is the heap's growth, less host tensors', over the nodes' growth
ALTER TABLE inventories ADD COLUMN heap INTEGER;
"""


# Version 10 (issue #21, files sized by time): once a run is long, the writer folds runs of
# consecutive uneventful steps into one row per window of wall time (memscope/store/fold.py); the
# steps near peaks, failures, events, inventories and profiles, and the run's last steps, stay whole
_V10 = """
CREATE TABLE step_windows (
    proc INTEGER NOT NULL,
    first_step INTEGER NOT NULL,    -- the window holds every step from first_step to last_step
    last_step INTEGER NOT NULL,
    steps INTEGER NOT NULL,         -- last_step - first_step + 1, all completed (status 'ok')
    start REAL NOT NULL,            -- first_step's start
    end REAL NOT NULL,              -- last_step's end
    duration_min REAL NOT NULL,     -- step durations (end - start), seconds
    duration_max REAL NOT NULL,
    duration_sum REAL NOT NULL,
    peak_rss INTEGER,               -- the highest steps.peak_rss among them, and its (earliest) step
    peak_rss_step INTEGER,
    peak_rss_sum INTEGER,
    peak_allocated INTEGER,         -- the same for steps.peak_allocated (CUDA)
    peak_allocated_step INTEGER,
    peak_reserved INTEGER,
    end_rss INTEGER,                -- the lowest steps.end_rss among them, and its step
    end_rss_step INTEGER,
    end_allocated INTEGER,          -- the lowest steps.end_allocated among them, and its step
    end_allocated_step INTEGER,
    PRIMARY KEY (proc, first_step)
);
"""

# a process memscope attached to while it ran (memscope attach --pid): when the process itself
# started and when memscope attached; processes.status may then be 'detached'
_V11 = """
ALTER TABLE processes ADD COLUMN attached REAL;
ALTER TABLE processes ADD COLUMN process_started REAL;
"""

# Version 12 (issue 34, side files only memscope made): the files a run's writers made beside the
# run file (spill files), so that only those are ever replayed into it (memscope/store/spill.py)
_V12 = """
CREATE TABLE side_files (
    proc INTEGER,                   -- the writing process it belongs to
    kind TEXT NOT NULL,             -- spill
    name TEXT NOT NULL,             -- its file name, in the run file's directory
    token TEXT NOT NULL,            -- the random token in its name and in its first line
    uid INTEGER NOT NULL,           -- who made it (a file of another owner is never replayed)
    file_id TEXT NOT NULL,          -- st_dev:st_ino when made (a file put in its place is not it)
    pid INTEGER,
    created REAL
);
"""


# Version 13 (issue 36, verdicts that do not depend on load): the free bytes malloc keeps, beside
# what it has handed out: host memory a heap holds on to while it warms up is not growth
_V13 = """
-- inventories.heap_free: free bytes in glibc malloc's arenas at the inventory (NULL: not glibc);
-- level - heap_free is the host memory in use (what growth nothing explains is judged on)
ALTER TABLE inventories ADD COLUMN heap_free INTEGER;
"""


# MIGRATIONS[n] takes a file from version n to n + 1: SQL scripts, run statement by statement
# inside one transaction (executescript would commit half-way).
MIGRATIONS: list[str] = [_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12, _V13]
assert len(MIGRATIONS) == SCHEMA_VERSION


def file_version(conn: sqlite3.Connection) -> tuple[int, int]:
    """Return (application_id, user_version) of an open database."""
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    ver = conn.execute("PRAGMA user_version").fetchone()[0]
    return app, ver


def check_version(conn: sqlite3.Connection, path: str) -> int:
    """Raise RunFileError unless ``conn`` is a run file this memscope can read."""
    try:
        app, ver = file_version(conn)
        if app == 0 and ver == 0:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if not names:
                raise RunFileError(f"{path}: empty file, not a memscope run")
    except sqlite3.DatabaseError as exc:
        raise RunFileError(f"{path}: not a memscope run file ({exc})") from None
    if app != APPLICATION_ID:
        raise RunFileError(f"{path}: an SQLite database, but not a memscope run file")
    if ver > SCHEMA_VERSION:
        raise RunFileError(
            f"{path}: written by a newer memscope (schema {ver}, this one reads up to "
            f"{SCHEMA_VERSION}); upgrade memscope to read it"
        )
    return ver


@functools.lru_cache(maxsize=None)
def expected_tables(version: int) -> dict[str, dict[str, tuple[str, bool]]]:
    """The tables a file of ``version`` has: {table: {column: (declared type, not null)}},
    from the migrations themselves (an in-memory file migrated that far)."""
    mem = sqlite3.connect(":memory:")
    try:
        for target in range(min(version, SCHEMA_VERSION)):
            for statement in _split_statements(MIGRATIONS[target]):
                mem.execute(statement)
        return {t: {r[1]: (str(r[2]).upper(), bool(r[3]))
                    for r in mem.execute(f"PRAGMA table_info({t})")}
                for (t,) in mem.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        mem.close()


def check_tables(conn: sqlite3.Connection, path: str, version: int) -> None:
    """Raise RunFileError unless the file has every table and column its version promises:
    a version-4 file without ``layer_stats`` is damaged, not an older file."""
    have: dict[str, dict[str, tuple[str, bool]]] = {}
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        if isinstance(name, str):
            quoted = name.replace('"', '""')
            have[name] = {r[1]: (str(r[2]).upper(), bool(r[3]))
                          for r in conn.execute(f'PRAGMA table_info("{quoted}")')}
    for table, columns in expected_tables(version).items():
        if table not in have:
            raise RunFileError(f"{path}: damaged run file: schema {version} has a {table} table, "
                               "this file has none")
        missing = sorted(set(columns) - set(have[table]))
        if missing:
            raise RunFileError(f"{path}: damaged run file: table {table} lacks column(s) "
                               f"{', '.join(missing)} of schema {version}")
        for column, (declared, notnull) in columns.items():
            if have[table][column] != (declared, notnull):
                # SQLite enforces types and NOT NULL as declared: a file whose declarations
                # changed was not written by memscope, and its values cannot be trusted
                raise RunFileError(f"{path}: damaged run file: column {table}.{column} is not "
                                   f"declared as schema {version} declares it")


def migrate(conn: sqlite3.Connection, path: str = "run file") -> None:
    """Bring a writable connection's file to SCHEMA_VERSION (creating it when empty).

    Runs under an immediate transaction so two processes starting at once migrate once.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        app, ver = file_version(conn)
        if app == 0 and ver == 0:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                raise RunFileError(f"{path}: an SQLite database, but not a memscope run file")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        elif app != APPLICATION_ID:
            raise RunFileError(f"{path}: an SQLite database, but not a memscope run file")
        if ver > SCHEMA_VERSION:
            raise RunFileError(
                f"{path}: written by a newer memscope (schema {ver} > {SCHEMA_VERSION})"
            )
        if ver:
            check_tables(conn, path, ver)
        for target in range(ver, SCHEMA_VERSION):
            for statement in _split_statements(MIGRATIONS[target]):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO migrations (version, applied) VALUES (?, ?)", (target + 1, time.time())
            )
            conn.execute(f"PRAGMA user_version = {target + 1}")
        conn.execute("COMMIT")
    except BaseException:
        # after SQLITE_FULL / an I/O error SQLite may have rolled back already: a second
        # ROLLBACK would hide the real error behind "no transaction is active"
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise


def _split_statements(script: str) -> list[str]:
    out: list[str] = []
    buf = ""
    for line in script.splitlines():
        line = line.split("--", 1)[0]
        buf += line + "\n"
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
