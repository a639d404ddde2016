-- The schema's views and triggers, one current definition each. Migrations create tables,
-- columns and indexes; after any migration runs, every view and trigger is dropped and these
-- are created again (see schema.rs), so a definition is changed here, with the migration that
-- needs it, and never copied.
--
-- Two kinds of object live here:
-- * the guards: what must hold whatever the interleaving of requests, refused by the
--   database itself with `RAISE(ABORT, 'refused: <code>')`;
-- * the write path: a mutation is one insert into the view `writes`, whose trigger checks
--   that no fact its plan read has changed since, records the idempotency key, applies the
--   plan's explicit lists and appends the event; triggers on the tables move the version of
--   each fact a write changes. See docs/design.md, "The write path".

-- A unit runs at most one VM (the unique index one_running_vm_per_unit), and a released unit
-- takes spot VMs only while its release lasts and its reservation's term covers the placement.
CREATE TRIGGER no_non_spot_vm_on_released_unit
    BEFORE INSERT ON vm_units
    WHEN NEW.running = 1 AND NEW.tier <> 'spot' AND EXISTS (
        SELECT 1 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id
        WHERE ru.node_id = NEW.node_id AND ru.unit_id = NEW.unit_id AND ru.released = 1
          AND (ru.released_until IS NULL OR ru.released_until > NEW.placed_at)
          AND r.state = 'live' AND r.starts_at <= NEW.placed_at
          AND (r.ends_at IS NULL OR r.ends_at > NEW.placed_at))
    BEGIN SELECT RAISE(ABORT, 'refused: released-spot-only'); END;

-- Nothing is placed on the units of a reservation withheld for review.
CREATE TRIGGER no_vm_on_needs_review_units
    BEFORE INSERT ON vm_units
    WHEN NEW.running = 1 AND EXISTS (
        SELECT 1 FROM reservation_units ru JOIN reservations r ON r.id = ru.reservation_id
        WHERE ru.node_id = NEW.node_id AND ru.unit_id = NEW.unit_id
          AND r.state = 'needs-review')
    BEGIN SELECT RAISE(ABORT, 'refused: withheld-needs-review'); END;

-- A unit running a non-spot VM is never released: neither by setting its flag or its end...
CREATE TRIGGER no_release_of_unit_running_non_spot_vm
    BEFORE UPDATE OF released, released_until ON reservation_units
    WHEN NEW.released = 1 AND EXISTS (
        SELECT 1 FROM vm_units v
        WHERE v.node_id = NEW.node_id AND v.unit_id = NEW.unit_id
          AND v.running = 1 AND v.tier <> 'spot')
    BEGIN SELECT RAISE(ABORT, 'refused: units-not-idle'); END;

-- ...nor by inserting it released.
CREATE TRIGGER no_released_insert_on_unit_running_non_spot_vm
    BEFORE INSERT ON reservation_units
    WHEN NEW.released = 1 AND EXISTS (
        SELECT 1 FROM vm_units v
        WHERE v.node_id = NEW.node_id AND v.unit_id = NEW.unit_id
          AND v.running = 1 AND v.tier <> 'spot')
    BEGIN SELECT RAISE(ABORT, 'refused: units-not-idle'); END;

-- A VM row never comes back to running, nor changes tier.
CREATE TRIGGER no_vm_row_revived_or_retiered
    BEFORE UPDATE OF running, tier ON vm_units
    WHEN NEW.tier <> OLD.tier OR (NEW.running = 1 AND OLD.running = 0)
    BEGIN SELECT RAISE(ABORT, 'refused: vm-rows-are-final'); END;

-- A deadline only ever moves earlier, and a VM's notice is never taken away.
CREATE TRIGGER no_notice_lengthened
    BEFORE UPDATE OF terminates_at ON vms
    WHEN OLD.terminates_at IS NOT NULL
        AND (NEW.terminates_at IS NULL OR NEW.terminates_at > OLD.terminates_at)
    BEGIN SELECT RAISE(ABORT, 'refused: notice-lengthened'); END;

-- A notice is given to spot VMs only.
CREATE TRIGGER no_notice_on_non_spot_vm
    BEFORE UPDATE OF terminates_at ON vms
    WHEN NEW.terminates_at IS NOT NULL AND NEW.tier <> 'spot'
    BEGIN SELECT RAISE(ABORT, 'refused: notice-on-non-spot-vm'); END;

-- Each new idempotency record sweeps up to two expired ones through the expiry index, so
-- storage stays bounded at O(1) per request.
CREATE TRIGGER idempotency_records_sweep
    AFTER INSERT ON idempotency_records
    BEGIN
        DELETE FROM idempotency_records WHERE rowid IN (
            SELECT rowid FROM idempotency_records
            WHERE expires_at <= NEW.created_at
            ORDER BY expires_at LIMIT 2);
    END;

-- Claims of keys across cells sweep the same way.
CREATE TRIGGER idempotency_claims_sweep
    AFTER INSERT ON idempotency_claims
    BEGIN
        DELETE FROM idempotency_claims WHERE rowid IN (
            SELECT rowid FROM idempotency_claims
            WHERE expires_at <= NEW.created_at
            ORDER BY expires_at LIMIT 2);
    END;

-- The write path. A row inserted here is one mutation: its audit event, the idempotency
-- record of the request if it has a key, `facts`, the versions of the facts its plan read
-- (`[[fact, version], ...]`), `seals`, the links it seals for the events before it in its
-- chain (`[[chainSeq, hash, seal], ...]`), and `changes`, the plan as explicit lists
-- (crate::write::Changes). Nothing here decides anything: the domain did; this checks that
-- what the plan read still holds, applies what it was given, and the guards above still
-- refuse whatever must never hold. Two things it does beyond the lists, neither a decision:
-- a VM already stopped is not stopped again (`status = 'running'`), and the market's index,
-- derived from the units' releases and terms, drops the units whose time has run out.
CREATE VIEW writes AS
    SELECT id, at, actor_key_id, actor_org_id, action, node_id, reservation_id, vm_id, org_id,
        subject_id, unit_ids, terminated, skipped, reason, request_id, client_request_id,
        visible_to, vm_owners, hash_version, hash, deadlines, release_until, chain, after_seq,
        NULL AS facts, NULL AS seals, NULL AS changes, NULL AS record_caller_key_id,
        NULL AS record_key, NULL AS record_fingerprint, NULL AS record_response,
        NULL AS record_expires_at, NULL AS audience, NULL AS caller_key_id,
        NULL AS schema_version
    FROM audit_events;

CREATE TRIGGER write_applies
    INSTEAD OF INSERT ON writes
BEGIN
    -- The write of a build whose schema is newer than this one (the number is this schema's
    -- version): that build brings the database up to date and writes again.
    SELECT RAISE(ABORT, 'behind: schema') WHERE NEW.schema_version > 23;
    -- The caller's key was revoked after the request was authenticated (at a site whose copy
    -- lagged, say): the request is refused whole. In a cell other than the directory's, the
    -- key is not here, but its revocation is (`revoked_keys`).
    SELECT RAISE(ABORT, 'refused: key-revoked')
        WHERE EXISTS (SELECT 1 FROM api_keys WHERE id = NEW.caller_key_id AND revoked_at IS NOT NULL)
           OR EXISTS (SELECT 1 FROM operator_keys
                      WHERE id = NEW.caller_key_id AND revoked_at IS NOT NULL)
           OR EXISTS (SELECT 1 FROM revoked_keys WHERE id = NEW.caller_key_id);
    -- A fact the plan read was changed by a write that committed since: the plan may be wrong.
    SELECT RAISE(ABORT, 'conflict: facts-moved')
        WHERE EXISTS (SELECT 1 FROM json_each(NEW.facts) f
                      LEFT JOIN fact_versions v ON v.fact = f.value ->> 0
                      WHERE COALESCE(v.version, 0) <> f.value ->> 1);
    -- A request with this key was carried out meanwhile (by a duplicate, on any replica).
    SELECT RAISE(ABORT, 'conflict: idempotency-key-recorded')
        WHERE NEW.record_key IS NOT NULL AND EXISTS (SELECT 1 FROM idempotency_records
            WHERE caller_key_id = NEW.record_caller_key_id AND idempotency_key = NEW.record_key
              AND expires_at > NEW.at);
    INSERT OR REPLACE INTO idempotency_records
            (caller_key_id, idempotency_key, fingerprint, response, created_at, expires_at)
        SELECT NEW.record_caller_key_id, NEW.record_key, NEW.record_fingerprint,
            NEW.record_response, NEW.at, NEW.record_expires_at
        WHERE NEW.record_key IS NOT NULL;

    INSERT INTO orgs (id, name, created_at)
        SELECT value ->> 'id', value ->> 'name', NEW.at
        FROM json_each(NEW.changes, '$.orgs');
    INSERT INTO api_keys (id, org_id, name, role, permissions, secret_hash, created_at, created_by)
        SELECT value ->> 'id', value ->> 'orgId', value ->> 'name', value ->> 'role',
            value ->> 'permissions', value ->> 'secretHash', NEW.at, NEW.actor_key_id
        FROM json_each(NEW.changes, '$.apiKeys');
    INSERT INTO operator_keys (id, name, secret_hash, created_at, created_by)
        SELECT value ->> 'id', value ->> 'name', value ->> 'secretHash', NEW.at, NEW.actor_key_id
        FROM json_each(NEW.changes, '$.operatorKeys');
    UPDATE api_keys SET revoked_at = NEW.at
        WHERE revoked_at IS NULL
          AND id IN (SELECT value FROM json_each(NEW.changes, '$.revokedApiKeys'));
    UPDATE operator_keys SET revoked_at = NEW.at
        WHERE revoked_at IS NULL
          AND id IN (SELECT value FROM json_each(NEW.changes, '$.revokedOperatorKeys'));

    INSERT INTO nodes (id, owner_org_id, topology_gen, unit_count, created_at, updated_at)
        SELECT NEW.node_id, NEW.changes ->> '$.newNode.ownerOrgId',
            NEW.changes ->> '$.newNode.topologyGen', NEW.changes ->> '$.newNode.unitCount',
            NEW.at, NEW.at
        WHERE NEW.changes -> '$.newNode' IS NOT NULL;
    UPDATE nodes SET owner_org_id = NEW.changes ->> '$.nodeUpdate.ownerOrgId',
            topology_gen = NEW.changes ->> '$.nodeUpdate.topologyGen',
            unit_count = NEW.changes ->> '$.nodeUpdate.unitCount',
            updated_at = NEW.at
        WHERE id = NEW.node_id AND NEW.changes -> '$.nodeUpdate' IS NOT NULL;
    DELETE FROM node_units
        WHERE node_id = NEW.node_id
          AND unit_id IN (SELECT value FROM json_each(NEW.changes, '$.removedNodeUnits'));
    INSERT INTO node_units (node_id, unit_id, position)
        SELECT NEW.node_id, value ->> 0, value ->> 1
        FROM json_each(NEW.changes, '$.addedNodeUnits');

    INSERT INTO reservations (id, node_id, state, starts_at, ends_at, allowed_org_ids,
            managing_org_ids, contract_ref, reason, topology_gen, created_at, updated_at)
        SELECT value ->> 'id', NEW.node_id, 'live', value ->> 'startsAt', value ->> 'endsAt',
            value -> 'allowedOrgIds', value -> 'managingOrgIds', value ->> 'contractRef',
            value ->> 'reason', value ->> 'topologyGen', NEW.at, NEW.at
        FROM json_each(NEW.changes, '$.reservations');
    UPDATE reservations SET
            state = (SELECT value ->> 'state' FROM json_each(NEW.changes, '$.reservationStates') s
                     WHERE s.value ->> 'id' = reservations.id),
            topology_gen = COALESCE(
                (SELECT value ->> 'topologyGen' FROM json_each(NEW.changes, '$.reservationStates') s
                 WHERE s.value ->> 'id' = reservations.id),
                topology_gen)
        WHERE node_id = NEW.node_id AND id IN
            (SELECT value ->> 'id' FROM json_each(NEW.changes, '$.reservationStates'));
    UPDATE reservations SET updated_at = NEW.at
        WHERE node_id = NEW.node_id
          AND id IN (SELECT value FROM json_each(NEW.changes, '$.touchedReservations'));
    DELETE FROM reservation_units
        WHERE reservation_id IN (SELECT value FROM json_each(NEW.changes, '$.replacedReservationUnits'));
    INSERT INTO reservation_units (reservation_id, position, node_id, unit_id, released, released_until)
        SELECT NEW.changes ->> '$.reservationUnits.reservationId', value ->> 0, NEW.node_id,
            value ->> 1, value ->> 2, value ->> 3
        FROM json_each(NEW.changes, '$.reservationUnits.units');
    UPDATE reservation_units SET released = 1,
            released_until = NEW.changes ->> '$.releasedUnits.until'
        WHERE reservation_id = NEW.changes ->> '$.releasedUnits.reservationId'
          AND unit_id IN (SELECT value FROM json_each(NEW.changes, '$.releasedUnits.unitIds'));
    UPDATE reservation_units SET released = 0, released_until = NULL
        WHERE reservation_id = NEW.changes ->> '$.reclaimedUnits.reservationId'
          AND unit_id IN (SELECT value FROM json_each(NEW.changes, '$.reclaimedUnits.unitIds'));

    UPDATE vms SET status = 'terminated',
            termination_reason = (SELECT value ->> 'reason' FROM json_each(NEW.changes, '$.endedVms') e
                                  WHERE e.value ->> 'id' = vms.id),
            terminated_at = (SELECT value ->> 'at' FROM json_each(NEW.changes, '$.endedVms') e
                             WHERE e.value ->> 'id' = vms.id)
        WHERE status = 'running'
          AND id IN (SELECT value ->> 'id' FROM json_each(NEW.changes, '$.endedVms'));
    UPDATE vm_units SET running = 0
        WHERE running = 1
          AND vm_id IN (SELECT value ->> 'id' FROM json_each(NEW.changes, '$.endedVms'));
    UPDATE vms SET
            terminates_at = (SELECT value ->> 'terminatesAt' FROM json_each(NEW.changes, '$.noticedVms') d
                             WHERE d.value ->> 'id' = vms.id),
            noticed_at = NEW.at,
            interruption_reason = (SELECT value ->> 'reason' FROM json_each(NEW.changes, '$.noticedVms') d
                                   WHERE d.value ->> 'id' = vms.id),
            interruption_reservation_id = NEW.reservation_id,
            interruption_unit_ids = (SELECT value ->> 'unitIds' FROM json_each(NEW.changes, '$.noticedVms') d
                                     WHERE d.value ->> 'id' = vms.id)
        WHERE status = 'running'
          AND id IN (SELECT value ->> 'id' FROM json_each(NEW.changes, '$.noticedVms'));
    INSERT INTO vms (id, org_id, node_id, tier, status, created_at, terminates_at, noticed_at,
            interruption_reason, interruption_reservation_id, interruption_unit_ids)
        SELECT value ->> 'id', value ->> 'orgId', NEW.node_id, value ->> 'tier', 'running', NEW.at,
            value ->> 'terminatesAt', CASE WHEN value ->> 'terminatesAt' IS NOT NULL THEN NEW.at END,
            value ->> 'interruptionReason', value ->> 'interruptionReservationId',
            value ->> 'interruptionUnitIds'
        FROM json_each(NEW.changes, '$.vms');
    INSERT INTO vm_units (vm_id, position, node_id, unit_id, tier, running, placed_at)
        SELECT v.value ->> 'id', u.key, NEW.node_id, u.value, v.value ->> 'tier', 1, NEW.at
        FROM json_each(NEW.changes, '$.vms') v, json_each(v.value, '$.unitIds') u;

    -- The links of earlier events this write saw unsealed: every writer computes the same
    -- seal for a place, so a link written twice is written alike.
    UPDATE audit_events SET seal = (SELECT s.value ->> 2 FROM json_each(NEW.seals) s
                                    WHERE s.value ->> 0 = audit_events.chain_seq)
        WHERE chain = NEW.chain AND seal IS NULL AND hash_version = 5
          AND chain_seq IN (SELECT value ->> 0 FROM json_each(NEW.seals))
          AND hash = (SELECT s.value ->> 1 FROM json_each(NEW.seals) s
                      WHERE s.value ->> 0 = audit_events.chain_seq);
    -- The event takes the next place of its chain, linked to the hash of the one before.
    INSERT INTO audit_events (seq, id, at, actor_key_id, actor_org_id, action, node_id,
            reservation_id, vm_id, org_id, subject_id, unit_ids, terminated, skipped, reason,
            request_id, client_request_id, visible_to, vm_owners, hash_version, prev_hash, hash,
            deadlines, release_until, chain, chain_seq, after_seq)
        SELECT NULL, NEW.id, NEW.at, NEW.actor_key_id, NEW.actor_org_id, NEW.action,
            NEW.node_id, NEW.reservation_id, NEW.vm_id, NEW.org_id, NEW.subject_id, NEW.unit_ids,
            NEW.terminated, NEW.skipped, NEW.reason, NEW.request_id, NEW.client_request_id,
            NEW.visible_to, NEW.vm_owners, NEW.hash_version,
            COALESCE(head.hash, '0000000000000000000000000000000000000000000000000000000000000000'),
            NEW.hash, NEW.deadlines, NEW.release_until, NEW.chain,
            COALESCE(head.chain_seq, 0) + 1, NEW.after_seq
        FROM (SELECT NULL) LEFT JOIN (SELECT chain_seq, hash FROM audit_events
                                      WHERE chain = NEW.chain
                                      ORDER BY chain_seq DESC LIMIT 1) head;
    -- Who sees the event, for the listings by need to know: [[orgId, fullView], ...].
    INSERT INTO audit_visibility (org_id, seq, full_view)
        SELECT value ->> 0, (SELECT seq FROM audit_events WHERE chain = NEW.chain
                             ORDER BY chain_seq DESC LIMIT 1), value ->> 1
        FROM json_each(NEW.audience);

    -- Units whose release or reservation term has ended leave the market's index.
    UPDATE reservation_units SET on_market = 0
        WHERE on_market = 1 AND market_ends_at <= NEW.at;
END;

-- The spot market's index (`on_market`, `market_ends_at`) follows the released units of live
-- reservations: a unit enters it when it is released (or inserted released) and leaves it
-- when it is reclaimed, its reservation is no longer live, or its time runs out (swept by
-- every write, above).
CREATE TRIGGER market_follows_new_unit
    AFTER INSERT ON reservation_units
BEGIN
    UPDATE reservation_units SET
            on_market = NEW.released = 1
                AND (SELECT state FROM reservations WHERE id = NEW.reservation_id) IS 'live',
            market_ends_at = (SELECT COALESCE(MIN(NEW.released_until, ends_at),
                    NEW.released_until, ends_at)
                FROM reservations WHERE id = NEW.reservation_id)
        WHERE reservation_id = NEW.reservation_id AND unit_id = NEW.unit_id;
END;

CREATE TRIGGER market_follows_release
    AFTER UPDATE OF released, released_until ON reservation_units
BEGIN
    UPDATE reservation_units SET
            on_market = NEW.released = 1
                AND (SELECT state FROM reservations WHERE id = NEW.reservation_id) IS 'live',
            market_ends_at = (SELECT COALESCE(MIN(NEW.released_until, ends_at),
                    NEW.released_until, ends_at)
                FROM reservations WHERE id = NEW.reservation_id)
        WHERE reservation_id = NEW.reservation_id AND unit_id = NEW.unit_id;
END;

CREATE TRIGGER market_follows_reservation_state
    AFTER UPDATE OF state ON reservations
    WHEN NEW.state <> OLD.state
BEGIN
    UPDATE reservation_units SET on_market = released = 1 AND NEW.state = 'live'
        WHERE reservation_id = NEW.id;
END;

-- A new place of a waiting feed poll sweeps the places that lapsed (their guest stopped
-- before it could give them back).
CREATE TRIGGER feed_wait_sweeps_lapsed
    AFTER INSERT ON feed_waits
BEGIN
    DELETE FROM feed_waits WHERE until <= NEW.started_at;
END;

-- Every fact a plan can read has a version, moved by each write that changes it, so that a
-- write re-checks exactly what its plan read (the trigger of `writes`): a node (its owner,
-- topology and units), a unit of a node (who may use it: its reservations' claims and
-- releases, the VM on it), a reservation (its state and term), a VM (its state and
-- deadline), an org, a key. Columns that decide nothing (`updated_at`, the market's index)
-- move no version, so releases of different units of one reservation never conflict.
--
-- A row inserted into `fact_moves` moves its fact's version by one (the first write of a
-- fact gives it version 1); the triggers below name the fact each change moves, as the
-- store's plans name the facts they read (src/facts.rs): a node's facts after the node, so
-- that those one write moves are neighbours (one page).
CREATE VIEW fact_moves AS SELECT fact FROM fact_versions;

CREATE TRIGGER fact_moves_up
    INSTEAD OF INSERT ON fact_moves
BEGIN
    INSERT INTO fact_versions (fact, version) VALUES (NEW.fact, 1)
        ON CONFLICT (fact) DO UPDATE SET version = version + 1;
END;

CREATE TRIGGER fact_node_created AFTER INSERT ON nodes
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.id));
END;

CREATE TRIGGER fact_node_changed AFTER UPDATE OF owner_org_id, topology_gen, unit_count ON nodes
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.id));
END;

CREATE TRIGGER fact_node_unit_added AFTER INSERT ON node_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'unit', NEW.unit_id));
END;

CREATE TRIGGER fact_node_unit_removed AFTER DELETE ON node_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', OLD.node_id, 'unit', OLD.unit_id));
END;

CREATE TRIGGER fact_reservation_created AFTER INSERT ON reservations
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'reservation', NEW.id));
END;

CREATE TRIGGER fact_reservation_changed
    AFTER UPDATE OF state, topology_gen, starts_at, ends_at, allowed_org_ids, managing_org_ids
    ON reservations
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'reservation', NEW.id));
END;

CREATE TRIGGER fact_unit_claimed AFTER INSERT ON reservation_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'unit', NEW.unit_id));
END;

CREATE TRIGGER fact_unit_unclaimed AFTER DELETE ON reservation_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', OLD.node_id, 'unit', OLD.unit_id));
END;

CREATE TRIGGER fact_unit_released_or_reclaimed
    AFTER UPDATE OF released, released_until ON reservation_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'unit', NEW.unit_id));
END;

CREATE TRIGGER fact_unit_taken AFTER INSERT ON vm_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'unit', NEW.unit_id));
END;

CREATE TRIGGER fact_unit_freed AFTER UPDATE OF running ON vm_units
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'unit', NEW.unit_id));
END;

CREATE TRIGGER fact_vm_created AFTER INSERT ON vms
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'vm', NEW.id));
END;

CREATE TRIGGER fact_vm_changed AFTER UPDATE OF status, terminates_at ON vms
    WHEN NEW.status = 'running'
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('node', NEW.node_id, 'vm', NEW.id));
END;

-- A VM that ended never changes again (no_vm_row_revived_or_retiered), so its version goes:
-- a plan that read it running sees it moved (to 0), and a node's versions stay those of its
-- live VMs, on few pages, instead of growing with every VM it ever ran.
CREATE TRIGGER fact_vm_ended AFTER UPDATE OF status ON vms
    WHEN NEW.status <> 'running'
BEGIN
    DELETE FROM fact_versions WHERE fact = json_array('node', NEW.node_id, 'vm', NEW.id);
END;

CREATE TRIGGER fact_org_created AFTER INSERT ON orgs
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('org', NEW.id));
END;

CREATE TRIGGER fact_api_key_created AFTER INSERT ON api_keys
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('key', NEW.id));
    INSERT INTO fact_moves (fact) VALUES (json_array('org-keys', NEW.org_id));
END;

CREATE TRIGGER fact_api_key_revoked AFTER UPDATE OF revoked_at ON api_keys
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('key', NEW.id));
    INSERT INTO fact_moves (fact) VALUES (json_array('org-keys', NEW.org_id));
END;

CREATE TRIGGER fact_operator_key_created AFTER INSERT ON operator_keys
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('key', NEW.id));
END;

CREATE TRIGGER fact_operator_key_revoked AFTER UPDATE OF revoked_at ON operator_keys
BEGIN
    INSERT INTO fact_moves (fact) VALUES (json_array('key', NEW.id));
END;
