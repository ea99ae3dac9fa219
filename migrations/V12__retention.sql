-- Retention: `jobs::retention` deletes holds that expired
-- `holds.retention_secs` ago and that no order took, and order events
-- delivered more than `outcomes.keep_days` ago. Without it both tables
-- grow with every on-sale, for ever. Orders are never deleted.
--
-- Each index serves one deletion, oldest due first, so that a batch reads
-- its own rows and none of the rows that stay (live holds, ordered ones,
-- events not delivered yet), however many there are. V8's index on
-- unordered holds leads with the buyer, so it cannot serve a range of
-- expiry across buyers.

CREATE INDEX holds_unordered_expiry_idx ON holds (expires_at) WHERE order_id IS NULL;

CREATE INDEX order_events_delivered_idx ON order_events (delivered_at)
    WHERE delivered_at IS NOT NULL;
