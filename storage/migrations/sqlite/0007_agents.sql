-- Hosted agents and their runs.
--
-- A run's budget is kept the way a project's balance is: by triggers, in the statements
-- that move the money, for every writer.
--   agent_runs.in_flight = sum of the holds of the run's steps still in flight
--   agent_runs.spent     = sum of the costs of the run's settled steps
--   spent + in_flight <= budget, always (checked before a step is admitted, and a CHECK)
-- A step is admitted by one INSERT (its trigger checks the remaining budget), then takes
-- its project hold (a reservation without key), and is closed by the very statements that
-- close that hold: the receipt's insertion charges the project AND adds the step's cost to
-- `spent`; the reservation's release (or a sweep of a dead owner's holds) frees it.

CREATE TABLE agents (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL REFERENCES projects (id),
    name         TEXT NOT NULL,
    model        TEXT NOT NULL,
    instructions TEXT NOT NULL DEFAULT '',
    tools        TEXT NOT NULL DEFAULT '[]',  -- JSON list: [] or ["sandbox"]
    sandbox_id   TEXT REFERENCES sandboxes (id),
    max_steps    INTEGER NOT NULL DEFAULT 8 CHECK (max_steps > 0),
    created_at   INTEGER NOT NULL
);
CREATE INDEX agents_project ON agents (project_id, created_at);

CREATE TABLE agent_runs (
    id               TEXT PRIMARY KEY,
    agent_id         TEXT NOT NULL REFERENCES agents (id),
    project_id       TEXT NOT NULL REFERENCES projects (id),
    input            TEXT NOT NULL,
    budget           INTEGER NOT NULL CHECK (budget >= 0),
    spent            INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0),
    in_flight        INTEGER NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    status           TEXT NOT NULL DEFAULT 'running' CHECK (
        status IN ('running', 'completed', 'failed', 'budget_exceeded', 'cancelled')
    ),
    output           TEXT,
    error            TEXT,  -- JSON error object {type, message}
    owner            TEXT NOT NULL,  -- the process running it: host:pid:start-time
    lease_until      INTEGER NOT NULL,  -- unix seconds; after this a sweeper fails the run
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    CHECK (spent + in_flight <= budget)
);
CREATE INDEX agent_runs_agent ON agent_runs (agent_id, created_at);
CREATE INDEX agent_runs_running ON agent_runs (owner) WHERE status = 'running';

CREATE TABLE agent_steps (
    run_id         TEXT NOT NULL REFERENCES agent_runs (id),
    seq            INTEGER NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('model', 'sandbox')),
    subject        TEXT NOT NULL,  -- model id or runtime
    hold           INTEGER NOT NULL CHECK (hold >= 0),
    state          TEXT NOT NULL DEFAULT 'in_flight'
                   CHECK (state IN ('in_flight', 'settled', 'released')),
    reservation_id TEXT,
    cost           INTEGER NOT NULL DEFAULT 0 CHECK (cost >= 0),
    receipt_id     TEXT,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    duration_ms    INTEGER NOT NULL DEFAULT 0,
    error          TEXT,  -- JSON error object
    created_at     INTEGER NOT NULL,
    -- Set once the step's record is complete (its usage and error written): the money
    -- columns above may close a moment earlier, in the hold's own statement.
    closed_at      INTEGER,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX agent_steps_reservation ON agent_steps (reservation_id);

-- Admission and the run's in-flight amount are one statement: two steps can never both
-- fit in what only one of them fits in, whichever processes run them.
CREATE TRIGGER agent_step_admits BEFORE INSERT ON agent_steps
BEGIN
    SELECT RAISE(ABORT, 'run_not_running')
    FROM agent_runs r WHERE r.id = NEW.run_id AND r.status <> 'running';
    SELECT RAISE(ABORT, 'run_cancelled')
    FROM agent_runs r WHERE r.id = NEW.run_id AND r.cancel_requested <> 0;
    SELECT RAISE(ABORT, 'budget_exceeded')
    FROM agent_runs r WHERE r.id = NEW.run_id AND r.spent + r.in_flight + NEW.hold > r.budget;
END;

CREATE TRIGGER agent_step_holds AFTER INSERT ON agent_steps
BEGIN
    UPDATE agent_runs SET in_flight = in_flight + NEW.hold WHERE id = NEW.run_id;
END;

-- One UPDATE for both columns: spent + in_flight never rises on the way (cost <= hold).
CREATE TRIGGER agent_step_closes AFTER UPDATE OF state ON agent_steps
WHEN OLD.state <> NEW.state
BEGIN
    UPDATE agent_runs SET
        in_flight = in_flight - CASE OLD.state WHEN 'in_flight' THEN OLD.hold ELSE 0 END,
        spent = spent + CASE NEW.state WHEN 'settled' THEN NEW.cost ELSE 0 END
    WHERE id = NEW.run_id;
END;

-- A step admitted by the run whose project hold was then refused never started.
CREATE TRIGGER agent_step_dropped AFTER DELETE ON agent_steps
WHEN OLD.state = 'in_flight'
BEGIN
    UPDATE agent_runs SET in_flight = in_flight - OLD.hold WHERE id = OLD.run_id;
END;

-- Agent steps reserve without a key: the WHEN keeps these off every keyed request. The
-- receipt's insertion also deletes its reservation (receipt_charges); whichever of the
-- two triggers SQLite fires first, the step ends settled with the receipt's cost.
CREATE TRIGGER receipt_settles_agent_step AFTER INSERT ON receipts
WHEN NEW.key_id IS NULL
BEGIN
    UPDATE agent_steps SET state = 'settled', cost = NEW.cost, receipt_id = NEW.id
    WHERE reservation_id = NEW.reservation_id AND state <> 'settled';
END;

CREATE TRIGGER reservation_releases_agent_step AFTER DELETE ON reservations
WHEN OLD.key_id IS NULL
BEGIN
    UPDATE agent_steps SET state = 'released'
    WHERE reservation_id = OLD.id AND state = 'in_flight';
END;

-- A run that ends (finished by its owner, or failed by a sweeper because its owner died)
-- leaves nothing held: its steps still in flight release their project holds.
CREATE TRIGGER agent_run_ends AFTER UPDATE OF status ON agent_runs
WHEN OLD.status = 'running' AND NEW.status <> 'running'
BEGIN
    DELETE FROM reservations WHERE id IN (
        SELECT reservation_id FROM agent_steps
        WHERE run_id = NEW.id AND state = 'in_flight' AND reservation_id IS NOT NULL
    );
    UPDATE agent_steps
    SET state = CASE state WHEN 'in_flight' THEN 'released' ELSE state END,
        closed_at = COALESCE(closed_at, NEW.finished_at)
    WHERE run_id = NEW.id AND (state = 'in_flight' OR closed_at IS NULL);
END;
