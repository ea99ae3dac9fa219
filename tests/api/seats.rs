use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use stagedoor_checkout::checkout::seat_maps::{CHANNEL, MAX_AGE, TRUSTED_AFTER};
use tokio::sync::Barrier;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::helpers::{new_key, spawn_app, spawn_app_with, Seen, TestApp};

#[tokio::test]
async fn the_seat_map_shows_available_held_and_sold_seats() {
    let app = spawn_app().await;
    let seats = app.seed("gala", 3, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let sold = app.hold("bob", seats[1]).await;
    let order = app
        .post_order("bob", &new_key(), &[sold], "pm_card_visa")
        .await;
    assert_eq!(order.status(), 201);

    let seen = Seen::of(app.get_seats("carol", "gala").await).await;
    assert_eq!(seen.status, 200);
    let body = seen.json();
    assert_eq!(body["event_id"], "gala");
    let statuses: Vec<(&str, &str, i64)> = body["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap(),
                s["status"].as_str().unwrap(),
                s["price_cents"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("A1", "held", 2500),
            ("A2", "sold", 2500),
            ("A3", "available", 2500)
        ]
    );
    assert!(hold > 0);
}

/// With every statement through the coordinator (`route_to_workers =
/// false`), a hold, a release and a seat map still find their event's
/// rows: on Citus where its slot puts them, which routing does not decide.
#[tokio::test]
async fn through_the_coordinator_alone_a_seat_map_and_its_holds_find_their_event() {
    let app = spawn_app_with(|s| s.database.route_to_workers = false).await;
    let seats = app.seed("unrouted", 2, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let released = app.hold("alice", seats[1]).await;
    let release = app
        .as_buyer(
            app.http.delete(app.url(&format!("/holds/{released}"))),
            "alice",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(release.status(), 204);
    let seen = Seen::of(app.get_seats("alice", "unrouted").await).await;
    assert_eq!(seen.status, 200, "{}", String::from_utf8_lossy(&seen.body));
    let body = seen.json();
    let statuses: Vec<(&str, Option<i64>)> = body["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["status"].as_str().unwrap(),
                s["your_hold"]["hold_id"].as_i64(),
            )
        })
        .collect();
    assert_eq!(statuses, [("held", Some(hold)), ("available", None)]);
}

#[tokio::test]
async fn an_unknown_event_is_404() {
    let app = spawn_app().await;
    let seen = Seen::of(app.get_seats("alice", "no-such-event").await).await;
    assert_eq!(seen.status, 404);
    assert_eq!(seen.problem(), "not-found");
}

#[tokio::test]
async fn an_event_id_no_database_can_hold_is_404_not_500() {
    // A NUL byte in the path once reached PostgreSQL, which cannot store it: a 500.
    let app = spawn_app().await;
    for event in ["%00", "demo%00", "a%00b"] {
        let seen = Seen::of(app.get_seats("alice", event).await).await;
        assert_eq!(seen.status, 404, "{event}");
        assert_eq!(seen.problem(), "not-found", "{event}");
    }
}

#[tokio::test]
async fn seeding_twice_adds_nothing() {
    let app = spawn_app().await;
    let first = app.seed("twice", 5, 1000).await;
    let second = app.seed("twice", 5, 9999).await;
    assert_eq!(first, second);
    let seen = Seen::of(app.get_seats("alice", "twice").await).await;
    assert!(seen.json()["seats"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["price_cents"] == 1000));
}

/// A page loaded after its buyer made holds still knows which seats are the
/// buyer's: the seat map names the caller's live holds, and nobody else's.
#[tokio::test]
async fn the_seat_map_names_the_callers_own_live_holds_and_no_one_elses() {
    let app = spawn_app().await;
    let seats = app.seed("gala", 3, 2500).await;
    let alices = app.hold("alice", seats[0]).await;
    let ordered = app.hold("alice", seats[1]).await;
    let order = app
        .post_order("alice", &new_key(), &[ordered], "pm_card_visa")
        .await;
    assert_eq!(order.status(), 201);

    let your_holds = |body: &serde_json::Value| -> Vec<serde_json::Value> {
        body["seats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["your_hold"].clone())
            .collect()
    };
    let alice = Seen::of(app.get_seats("alice", "gala").await).await.json();
    let mine = your_holds(&alice);
    assert_eq!(mine[0]["hold_id"], alices, "alice's live hold");
    assert!(mine[0]["expires_at"]
        .as_str()
        .is_some_and(|at| at.ends_with('Z')));
    assert_eq!(
        mine[1],
        serde_json::Value::Null,
        "a sold seat is no hold to pay"
    );
    assert_eq!(mine[2], serde_json::Value::Null);

    let bob = Seen::of(app.get_seats("bob", "gala").await).await.json();
    assert_eq!(bob["seats"][0]["status"], "held");
    assert!(
        your_holds(&bob).iter().all(serde_json::Value::is_null),
        "bob sees alice's seat held, not her hold: {bob}"
    );
}

/// The seat map reads its event's holds, not every hold ever made: with
/// the holds of past events in the table (50,000 across 10,000 seats), its
/// plan, made as the pool's, probes each seat's holds through an index on
/// the seat, never scans the table.
#[tokio::test]
async fn the_seat_map_reads_no_other_events_holds() {
    let app = spawn_app().await;
    app.seed("show", 2_000, 1000).await;
    let client = app.db.client().await;
    let slot: i32 = client
        .query_one("SELECT slot FROM events WHERE event_id = 'show'", &[])
        .await
        .unwrap()
        .get(0);
    // The past event in the show's slot, hence in its shard on Citus (the
    // slot of a new event is 12 bits of the hash of its id there).
    let past_event = (0..)
        .map(|n| format!("past-{n}"))
        .find(|id| slot == 0 || idempotency::hashtext(id) & 4095 == slot)
        .unwrap();
    let past = app.seed(&past_event, 10_000, 1000).await;
    // Five expired holds on each seat of the past event, one after another.
    client
        .execute(
            "INSERT INTO holds (slot, seat_id, user_id, created_at, expires_at)
             SELECT seat_id >> 40, seat_id, 'crowd', now() - interval '30 days' + n * interval '10 minutes',
                    now() - interval '30 days' + n * interval '10 minutes' + interval '5 minutes'
             FROM unnest($1::bigint[]) AS seat_id, generate_series(1, 5) AS n",
            &[&past],
        )
        .await
        .unwrap();
    // Planned as the pool plans it: generic, unless `database.generic_plans`
    // is off (Citus).
    let plans = if app.settings.database.generic_plans {
        "force_generic_plan"
    } else {
        "auto"
    };
    client
        .batch_execute(&format!(
            "ANALYZE holds, seats;
             SET plan_cache_mode = {plans};
             PREPARE seat_map (text, integer) AS {};
             PREPARE own_holds (text, text, integer) AS {}",
            stagedoor_checkout::checkout::seats::SEAT_MAP_STATEMENT,
            stagedoor_checkout::checkout::seats::OWN_HOLDS_STATEMENT,
        ))
        .await
        .unwrap();
    let plan = explain(&client, &format!("EXECUTE seat_map ('show', {slot})")).await;
    assert!(!plan.contains("Seq Scan on holds"), "{plan}");
    assert!(
        plan.lines()
            .any(|line| line.contains("Index Cond") && line.contains("seat_id = s.seat_id)")),
        "{plan}"
    );
    if test_support::citus::enabled() {
        // One task: the slot's shard alone.
        assert!(plan.contains("Task Count: 1"), "{plan}");
    }
    // Each view's read of the caller's own holds: through the buyer's live
    // holds, or the live holds of every buyer, never the expired ones.
    let plan = explain(
        &client,
        &format!("EXECUTE own_holds ('crowd', 'show', {slot})"),
    )
    .await;
    assert!(!plan.contains("Seq Scan on holds"), "{plan}");
    assert!(
        ["holds_live_by_buyer_idx", "holds_unordered_expiry_idx"]
            .iter()
            // (On Citus each name carries its shard's suffix.)
            .any(|index| plan.contains(&format!("using {index}"))),
        "{plan}"
    );
}

async fn explain(client: &tokio_postgres::Client, statement: &str) -> String {
    let plan: Vec<String> = client
        .simple_query(&format!("EXPLAIN {statement}"))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    plan.join("\n")
}

/// A seat map's answer: its status, headers and body bytes as sent.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// `GET /events/show/seats` as `buyer`, with these request headers.
async fn get_seats_with(app: &TestApp, buyer: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = app.as_buyer(app.http.get(app.url("/events/show/seats")), buyer);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    Answer {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.unwrap().to_vec(),
    }
}

fn header<'a>(seen: &'a Answer, name: &str) -> Option<&'a str> {
    seen.headers.get(name).and_then(|v| v.to_str().ok())
}

fn etag(seen: &Answer) -> String {
    header(seen, "etag").expect("an ETag").to_owned()
}

/// A poll that changed nothing costs a 304 and no body; a change of
/// anyone's hold, or of the caller's own, makes a new tag.
#[tokio::test]
async fn the_seat_map_is_304_while_its_etag_still_matches() {
    let app = spawn_app().await;
    let seats = app.seed("show", 4, 1000).await;
    let first = get_seats_with(&app, "alice", &[]).await;
    assert_eq!(first.status, 200);
    let tag = etag(&first);
    assert!(tag.starts_with("W/\""), "{tag}");
    assert_eq!(header(&first, "cache-control"), Some("private, no-cache"));
    assert_eq!(header(&first, "vary"), Some("Accept-Encoding"));
    assert_eq!(header(&first, "content-type"), Some("application/json"));

    for (if_none_match, why) in [
        (tag.clone(), "the tag"),
        (tag.trim_start_matches("W/").to_owned(), "the tag, strong"),
        (format!("\"other\", {tag}"), "the tag in a list"),
        ("*".to_owned(), "any"),
    ] {
        let again = get_seats_with(&app, "alice", &[("If-None-Match", &if_none_match)]).await;
        assert_eq!(again.status, 304, "{why}");
        assert!(again.body.is_empty(), "{why}");
        assert_eq!(etag(&again), tag, "{why}");
        assert_eq!(header(&again, "cache-control"), Some("private, no-cache"));
        assert_eq!(header(&again, "vary"), Some("Accept-Encoding"));
    }
    let other = get_seats_with(&app, "alice", &[("If-None-Match", "W/\"other\"")]).await;
    assert_eq!((other.status, &other.body), (200, &first.body));

    // Another buyer's hold changes the map, and so its tag, once the
    // snapshot the instance keeps is past its age.
    app.hold("bob", seats[0]).await;
    tokio::time::sleep(MAX_AGE).await;
    let changed = get_seats_with(&app, "alice", &[("If-None-Match", &tag)]).await;
    assert_eq!(changed.status, 200);
    assert_ne!(etag(&changed), tag);
    assert_eq!(changed.json()["seats"][0]["status"], "held");
    // So does the caller's own hold, which only their map shows as theirs.
    let tag = etag(&changed);
    let mine = app.hold("alice", seats[1]).await;
    let changed = get_seats_with(&app, "alice", &[("If-None-Match", &tag)]).await;
    assert_eq!(changed.status, 200);
    assert_eq!(changed.json()["seats"][1]["your_hold"]["hold_id"], mine);
}

/// The body is gzipped when the caller prefers gzip, and is then the same
/// bytes as the identity body once decompressed; the tag is the same.
#[tokio::test]
async fn the_seat_map_is_gzipped_when_the_caller_accepts_gzip() {
    use std::io::Read;

    let app = spawn_app().await;
    let seats = app.seed("show", 2_000, 1000).await;
    app.hold("alice", seats[7]).await;
    let plain = get_seats_with(&app, "alice", &[]).await;
    assert_eq!(header(&plain, "content-encoding"), None);
    serde_json::from_slice::<serde_json::Value>(&plain.body).unwrap();

    for accepted in ["gzip", "gzip, deflate, br", "identity;q=0.5, gzip"] {
        let gzipped = get_seats_with(&app, "alice", &[("Accept-Encoding", accepted)]).await;
        assert_eq!(gzipped.status, 200, "{accepted}");
        assert_eq!(
            header(&gzipped, "content-encoding"),
            Some("gzip"),
            "{accepted}"
        );
        assert_eq!(etag(&gzipped), etag(&plain), "{accepted}");
        let mut body = Vec::new();
        flate2::read::GzDecoder::new(&gzipped.body[..])
            .read_to_end(&mut body)
            .unwrap();
        assert_eq!(body, plain.body, "{accepted}");
        assert!(
            gzipped.body.len() * 5 < plain.body.len(),
            "{accepted}: {} bytes gzipped of {}",
            gzipped.body.len(),
            plain.body.len()
        );
    }
    for refused in ["gzip;q=0", "identity", "br", "identity, gzip;q=0.5"] {
        let seen = get_seats_with(&app, "alice", &[("Accept-Encoding", refused)]).await;
        assert_eq!(header(&seen, "content-encoding"), None, "{refused}");
        assert_eq!(seen.body, plain.body, "{refused}");
    }
    let not_modified = get_seats_with(
        &app,
        "alice",
        &[
            ("Accept-Encoding", "gzip"),
            ("If-None-Match", &etag(&plain)),
        ],
    )
    .await;
    assert_eq!(not_modified.status, 304);
    assert!(not_modified.body.is_empty());
}

/// `GET /events/show/seats` as `buyer`: each seat's status and `your_hold`'s id.
async fn statuses(app: &TestApp, buyer: &str) -> Vec<(String, Option<i64>)> {
    let seen = get_seats_with(app, buyer, &[]).await;
    assert_eq!(seen.status, 200);
    seen.json()["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["status"].as_str().unwrap().to_owned(),
                s["your_hold"]["hold_id"].as_i64(),
            )
        })
        .collect()
}

/// Two instances on one database, each with the map in memory: a hold
/// made on one is in its holder's next map there at once, and in
/// everyone's on the other once its notice is heard or, at the latest,
/// once that one's snapshot is past its age (docs/API.md).
#[tokio::test]
async fn a_hold_on_one_instance_shows_on_the_others_map_within_its_age() {
    let one = spawn_app().await;
    let other = one.another_instance().await;
    let seats = one.seed("show", 3, 1000).await;
    // Both instances keep the map of a night with no hold.
    for app in [&one, &other] {
        for buyer in ["alice", "bob"] {
            assert!(statuses(app, buyer)
                .await
                .iter()
                .all(|(status, mine)| status == "available" && mine.is_none()));
        }
    }

    let hold = one.hold("alice", seats[1]).await;
    let alices = statuses(&one, "alice").await;
    assert_eq!(alices[1], ("held".to_owned(), Some(hold)), "at once");
    tokio::time::sleep(MAX_AGE).await;
    let alices = statuses(&other, "alice").await;
    assert_eq!(alices[1], ("held".to_owned(), Some(hold)), "within its age");
    let bobs = statuses(&other, "bob").await;
    assert_eq!(bobs[1], ("held".to_owned(), None), "within its age");

    // A release too, and the holder's own map at once.
    assert_eq!(one.delete_hold("alice", hold).await.status(), 204);
    assert_eq!(
        statuses(&one, "alice").await[1],
        ("available".to_owned(), None)
    );
    tokio::time::sleep(MAX_AGE).await;
    for buyer in ["alice", "bob"] {
        assert_eq!(
            statuses(&other, buyer).await[1],
            ("available".to_owned(), None)
        );
    }
}

/// A view costs no statement while its snapshot is young: with every
/// read of the holds blocked (another transaction locks the table), the
/// crowd's views and the holder's own are still answered, exact.
#[tokio::test]
async fn a_view_of_a_young_snapshot_reads_nothing() {
    let app = spawn_app().await;
    let seats = app.seed("show", 4, 1000).await;
    // Past the listener's first seconds, when nothing is trusted.
    tokio::time::sleep(TRUSTED_AFTER).await;
    let hold = app.hold("alice", seats[0]).await;
    // A snapshot read after the hold (the one made before is past its age).
    tokio::time::sleep(MAX_AGE).await;
    assert_eq!(statuses(&app, "bob").await[0], ("held".to_owned(), None));

    let (_locker, answered) = views_while_holds_are_locked(&app).await;
    assert!(answered.len() >= 2, "answered {answered:?}");
    for (buyer, seat) in answered {
        let expected = if buyer == "alice" { Some(hold) } else { None };
        assert_eq!(seat, ("held".to_owned(), expected), "{buyer}");
    }
}

/// Two instances that know of each other: a hold made on one is told to
/// the other, whose next view of the holder's map reads the holder's holds
/// (here it blocks on the locked table), while the crowd's still come from
/// memory.
#[tokio::test]
async fn a_hold_made_on_another_instance_is_read_for_its_holder() {
    let one = spawn_app().await;
    let other = one.another_instance().await;
    let seats = one.seed("show", 4, 1000).await;
    // Each has counted the other, and trusts its snapshots.
    tokio::time::sleep(TRUSTED_AFTER + Duration::from_secs(1)).await;
    assert_eq!(statuses(&other, "bob").await[0].0, "available");
    one.hold("alice", seats[0]).await;
    // The notice is on its way to the other: long heard by now.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let locker = test_support::db::connect(&one.db.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE holds IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let alices = tokio::time::timeout(Duration::from_millis(250), statuses(&other, "alice")).await;
    assert!(
        alices.is_err(),
        "alice's view did not read her holds: {alices:?}"
    );
    drop(locker);
    assert_eq!(
        statuses(&other, "alice").await[0].0,
        "held",
        "and it read them"
    );
}

/// Changes that race share their notices: one notice names every buyer
/// whose change came while the one before was on its way, and every
/// buyer is named. 48 buyers hold a seat each at once on one instance,
/// beside another.
#[tokio::test]
async fn racing_changes_share_their_notices_and_every_buyer_is_named() {
    const BUYERS: usize = 48;
    let one = spawn_app().await;
    let _other = one.another_instance().await;
    let seats = one.seed("show", BUYERS as u32, 1000).await;
    // Each has counted the other, so `one` tells its changes.
    tokio::time::sleep(TRUSTED_AFTER + Duration::from_secs(1)).await;
    let (listener, mut connection) = one
        .db
        .url
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(NoTls)
        .await
        .unwrap();
    let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(notice) = message {
                let _ = notices.send(notice.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .unwrap();

    let barrier = Arc::new(Barrier::new(BUYERS));
    let one = Arc::new(one);
    let holds: Vec<_> = seats
        .iter()
        .enumerate()
        .map(|(i, &seat)| {
            let (one, barrier) = (one.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                one.hold(&format!("buyer-{i}"), seat).await
            })
        })
        .collect();
    for hold in holds {
        hold.await.unwrap();
    }

    let mut named = HashSet::new();
    let mut notices = 0;
    while named.len() < BUYERS {
        let payload = tokio::time::timeout(Duration::from_secs(5), heard.recv())
            .await
            .unwrap_or_else(|_| panic!("named so far: {named:?}"))
            .unwrap();
        let (_token, buyers) = payload.split_once(' ').unwrap();
        named.extend(buyers.lines().map(str::to_owned));
        notices += 1;
    }
    let expected: HashSet<_> = (0..BUYERS).map(|i| format!("buyer-{i}")).collect();
    assert_eq!(named, expected);
    assert!(notices < BUYERS, "{notices} notices for {BUYERS} changes");
}

/// An instance that lost its listener could miss another's change of a
/// buyer's holds: until it listens again, each view reads its caller's.
#[tokio::test]
async fn without_its_listener_an_instance_reads_each_callers_holds() {
    let app = spawn_app().await;
    app.seed("show", 4, 1000).await;
    let listener = "application_name = 'stagedoor-holds-listener' AND datname = current_database()";
    let count = format!("SELECT count(*) FROM pg_stat_activity WHERE {listener}");
    while app.count(&count).await == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed = app
        .count(&format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                   WHERE {listener}) AS t"
        ))
        .await;
    assert_eq!(killed, 1);
    // It reconnects after a second; before, a young snapshot.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(statuses(&app, "bob").await[0].0, "available");

    let (_locker, answered) = views_while_holds_are_locked(&app).await;
    assert!(
        answered.is_empty(),
        "answered from memory alone: {answered:?}"
    );
}

/// Locks the holds against any read, then asks for the map as alice and
/// bob in turn (each given 250 ms) until one is not answered: the answers
/// (buyer, first seat), and the locking connection (the lock goes with it).
async fn views_while_holds_are_locked(
    app: &TestApp,
) -> (
    tokio_postgres::Client,
    Vec<(&'static str, (String, Option<i64>))>,
) {
    let locker = test_support::db::connect(&app.db.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE holds IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut answered = Vec::new();
    for buyer in ["alice", "bob"].into_iter().cycle().take(8) {
        match tokio::time::timeout(Duration::from_millis(250), statuses(app, buyer)).await {
            Ok(seats) => answered.push((buyer, seats[0].clone())),
            Err(_) => break,
        }
    }
    (locker, answered)
}

/// A hold that expires changes the map with no statement: the snapshot is
/// not kept past its first expiry.
#[tokio::test]
async fn an_expired_hold_leaves_the_map() {
    let app = spawn_app_with(|s| s.holds.ttl_secs = 1).await;
    let seats = app.seed("show", 2, 1000).await;
    let hold = app.hold("alice", seats[0]).await;
    assert_eq!(statuses(&app, "bob").await[0], ("held".to_owned(), None));
    assert_eq!(
        statuses(&app, "alice").await[0],
        ("held".to_owned(), Some(hold))
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for buyer in ["bob", "alice"] {
        assert_eq!(
            statuses(&app, buyer).await[0],
            ("available".to_owned(), None),
            "{buyer}"
        );
    }
}

/// At steady state a poll is a 304 on every instance, for the crowd and
/// for a holder alike, each snapshot read again or not.
#[tokio::test]
async fn a_poll_at_steady_state_is_304_on_every_instance() {
    let one = spawn_app().await;
    let other = one.another_instance().await;
    let seats = one.seed("show", 20, 1000).await;
    one.hold("alice", seats[3]).await;
    for buyer in ["alice", "bob"] {
        let tag = etag(&get_seats_with(&one, buyer, &[]).await);
        for round in 0..3 {
            for app in [&one, &other] {
                let again = get_seats_with(app, buyer, &[("If-None-Match", &tag)]).await;
                assert_eq!(again.status, 304, "{buyer}, round {round}");
            }
            tokio::time::sleep(MAX_AGE / 2).await;
        }
    }
}

/// Without the database a map is not served from memory past its age:
/// the snapshot cannot be read again, nor the caller's own holds, and the
/// answer is an error, never a stale map.
#[tokio::test]
async fn without_the_database_no_stale_map_is_served() {
    let app = spawn_app_with(|s| s.database.pool_timeout_ms = 1_000).await;
    app.seed("show", 4, 1000).await;
    assert_eq!(get_seats_with(&app, "alice", &[]).await.status, 200);

    // The database takes no connection any more, and the instance's are cut.
    app.db.close().await;
    tokio::time::sleep(MAX_AGE).await;
    for buyer in ["alice", "bob"] {
        let seen = get_seats_with(&app, buyer, &[]).await;
        assert!(
            seen.status >= 500,
            "{buyer}: {} {}",
            seen.status,
            String::from_utf8_lossy(&seen.body)
        );
    }
}
