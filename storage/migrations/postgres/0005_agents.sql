-- Hosted agents and their runs (main's SQLite 0007). A run's budget is kept as a
-- project's balance is: by triggers, in the statements that move the money.
--   agent_runs.in_flight = sum of the holds of the run's steps still in flight
--   agent_runs.spent     = sum of the costs of the run's settled steps
--   spent + in_flight <= budget, always (checked under the run's row lock, and a CHECK)
-- A step is admitted by one INSERT (its trigger locks the run row, checks the remaining
-- budget and adds the hold), then takes its project hold (a reservation without key), and
-- is closed by the statements that close that hold: the receipt's insertion (which
-- deletes the hold, then marks the step settled with its cost) or the hold's release.
-- Custom SQLSTATE GWA01: a step refused because of its run's state; the message is the
-- reason (run_not_running, run_cancelled). A refused budget is GWL01 budget_exceeded.

CREATE TABLE agents (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL REFERENCES projects (id),
    name         TEXT NOT NULL,
    model        TEXT NOT NULL,
    instructions TEXT NOT NULL DEFAULT '',
    tools        TEXT NOT NULL DEFAULT '[]',  -- JSON list: [] or ["sandbox"]
    sandbox_id   TEXT REFERENCES sandboxes (id),
    max_steps    INTEGER NOT NULL DEFAULT 8 CHECK (max_steps > 0),
    created_at   BIGINT NOT NULL
);
CREATE INDEX agents_project ON agents (project_id, created_at);

CREATE TABLE agent_runs (
    id               TEXT PRIMARY KEY,
    agent_id         TEXT NOT NULL REFERENCES agents (id),
    project_id       TEXT NOT NULL REFERENCES projects (id),
    input            TEXT NOT NULL,
    budget           BIGINT NOT NULL CHECK (budget >= 0),
    spent            BIGINT NOT NULL DEFAULT 0 CHECK (spent >= 0),
    in_flight        BIGINT NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    status           TEXT NOT NULL DEFAULT 'running' CHECK (
        status IN ('running', 'completed', 'failed', 'budget_exceeded', 'cancelled')
    ),
    output           TEXT,
    error            TEXT,  -- JSON error object {type, message}
    owner            TEXT NOT NULL,
    lease_until      BIGINT NOT NULL,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    created_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    CHECK (spent + in_flight <= budget)
);
CREATE INDEX agent_runs_agent ON agent_runs (agent_id, created_at);
CREATE INDEX agent_runs_running ON agent_runs (owner) WHERE status = 'running';

CREATE TABLE agent_steps (
    run_id         TEXT NOT NULL REFERENCES agent_runs (id),
    seq            INTEGER NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('model', 'sandbox')),
    subject        TEXT NOT NULL,
    hold           BIGINT NOT NULL CHECK (hold >= 0),
    state          TEXT NOT NULL DEFAULT 'in_flight'
                   CHECK (state IN ('in_flight', 'settled', 'released')),
    reservation_id TEXT,
    cost           BIGINT NOT NULL DEFAULT 0 CHECK (cost >= 0),
    receipt_id     TEXT,
    input_tokens   BIGINT NOT NULL DEFAULT 0,
    output_tokens  BIGINT NOT NULL DEFAULT 0,
    duration_ms    BIGINT NOT NULL DEFAULT 0,
    error          TEXT,
    created_at     BIGINT NOT NULL,
    closed_at      BIGINT,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX agent_steps_reservation ON agent_steps (reservation_id);

-- Admission and the run's in-flight amount in one statement, under the run's row lock:
-- two steps can never both fit in what only one of them fits in, whatever process.
CREATE FUNCTION agent_step_admits() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r agent_runs%ROWTYPE;
BEGIN
    SELECT * INTO r FROM agent_runs WHERE id = NEW.run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NEW;  -- the foreign key refuses the row
    END IF;
    IF r.status <> 'running' THEN
        RAISE EXCEPTION 'run_not_running' USING ERRCODE = 'GWA01';
    END IF;
    IF r.cancel_requested THEN
        RAISE EXCEPTION 'run_cancelled' USING ERRCODE = 'GWA01';
    END IF;
    IF r.spent + r.in_flight + NEW.hold > r.budget THEN
        RAISE EXCEPTION 'budget_exceeded' USING ERRCODE = 'GWL01';
    END IF;
    UPDATE agent_runs SET in_flight = in_flight + NEW.hold WHERE id = NEW.run_id;
    RETURN NEW;
END
$$;

CREATE TRIGGER agent_step_admits BEFORE INSERT ON agent_steps
FOR EACH ROW EXECUTE FUNCTION agent_step_admits();

-- One UPDATE for both columns: spent + in_flight never rises on the way (cost <= hold).
CREATE FUNCTION agent_step_closes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE agent_runs SET
        in_flight = in_flight - CASE OLD.state WHEN 'in_flight' THEN OLD.hold ELSE 0 END,
        spent = spent + CASE NEW.state WHEN 'settled' THEN NEW.cost ELSE 0 END
    WHERE id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_step_closes AFTER UPDATE OF state ON agent_steps
FOR EACH ROW WHEN (OLD.state <> NEW.state) EXECUTE FUNCTION agent_step_closes();

-- A step admitted by the run whose project hold was then refused never started.
CREATE FUNCTION agent_step_dropped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE agent_runs SET in_flight = in_flight - OLD.hold WHERE id = OLD.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_step_dropped AFTER DELETE ON agent_steps
FOR EACH ROW WHEN (OLD.state = 'in_flight') EXECUTE FUNCTION agent_step_dropped();

-- Agent steps reserve without a key: the WHEN keeps these off every keyed request. The
-- receipt's insertion first deletes its reservation (receipt_consumes_hold, which marks
-- the step released), then this marks it settled with the receipt's cost: in all, the
-- hold leaves in_flight and the cost enters spent.
CREATE FUNCTION receipt_settles_agent_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE agent_steps SET state = 'settled', cost = NEW.cost, receipt_id = NEW.id
    WHERE reservation_id = NEW.reservation_id AND state <> 'settled';
    RETURN NULL;
END
$$;

CREATE TRIGGER receipt_settles_agent_step AFTER INSERT ON receipts
FOR EACH ROW WHEN (NEW.key_id IS NULL) EXECUTE FUNCTION receipt_settles_agent_step();

CREATE FUNCTION reservation_releases_agent_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE agent_steps SET state = 'released'
    WHERE reservation_id = OLD.id AND state = 'in_flight';
    RETURN NULL;
END
$$;

CREATE TRIGGER reservation_releases_agent_step AFTER DELETE ON reservations
FOR EACH ROW WHEN (OLD.key_id IS NULL) EXECUTE FUNCTION reservation_releases_agent_step();

-- A run that ends leaves nothing held: its steps in flight release their project holds.
CREATE FUNCTION agent_run_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM reservations WHERE id IN (
        SELECT reservation_id FROM agent_steps
        WHERE run_id = NEW.id AND state = 'in_flight' AND reservation_id IS NOT NULL
    );
    UPDATE agent_steps
    SET state = CASE state WHEN 'in_flight' THEN 'released' ELSE state END,
        closed_at = COALESCE(closed_at, NEW.finished_at)
    WHERE run_id = NEW.id AND (state = 'in_flight' OR closed_at IS NULL);
    RETURN NULL;
END
$$;

CREATE TRIGGER agent_run_ends AFTER UPDATE OF status ON agent_runs
FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
EXECUTE FUNCTION agent_run_ends();
