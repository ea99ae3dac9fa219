-- The seat map finds each seat's live or ordered hold by `seat_id`, and no
-- index served that: PostgreSQL read every hold ever made, of every event,
-- for each view. With 400,000 expired holds of other events, a 2,000-seat
-- map took 51 ms (a parallel scan of the whole table); through this index,
-- one probe per seat (src/checkout/seats.rs), 7 ms. A probe reads its own
-- seat's holds only, which the retention (V12) keeps to about a day of
-- history besides the one that sold it.
CREATE INDEX holds_seat_idx ON holds (seat_id);
