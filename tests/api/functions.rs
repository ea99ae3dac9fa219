//! Each SQL function has one live file: its current body is in
//! `migrations/functions/checkout.sql` (the service's) or
//! `crates/idempotency/migrations/functions/idempotency.sql` (the
//! engine's), defined once across both, and that is the body the database
//! runs after the migrations. Versioned migrations keep the schema; none
//! written since the live files defines a function.

use std::collections::BTreeMap;
use std::path::Path;

use crate::helpers::{self, TestDatabase};

const SERVICE: &str = include_str!("../../migrations/functions/checkout.sql");
const ENGINE: &str = include_str!("../../crates/idempotency/migrations/functions/idempotency.sql");

/// The versioned migrations of each owner before its live file, which may
/// define functions (they are applied and never edited); every later one
/// must not.
const LAST_WITH_FUNCTIONS: [(&str, u32); 2] =
    [("migrations", 15), ("crates/idempotency/migrations", 5)];

/// Each function a live file defines, by name, with its body (the text
/// between its `$$` quotes).
fn bodies(file: &str) -> Vec<(String, String)> {
    const CREATE: &str = "CREATE OR REPLACE FUNCTION ";
    file.match_indices(CREATE)
        .map(|(at, _)| {
            let rest = &file[at + CREATE.len()..];
            let name = rest[..rest.find('(').expect("an argument list")].to_owned();
            let open = rest.find("$$").expect("a $$-quoted body") + 2;
            let close = open + rest[open..].find("$$").expect("the body's end");
            (name, rest[open..close].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn every_function_runs_the_body_of_its_one_live_file() {
    let mut live = BTreeMap::new();
    for (owner, file) in [("checkout", SERVICE), ("idempotency", ENGINE)] {
        for (name, body) in bodies(file) {
            let twice = live.insert(name.clone(), (owner, body));
            assert!(twice.is_none(), "{name} is defined twice");
        }
    }
    assert!(live.len() >= 10, "the live files were read: {live:?}");

    let db = TestDatabase::create().await;
    let mut settings = helpers::test_layer();
    settings.database.url = db.url.clone().into();
    stagedoor_checkout::db::migrate(&settings.database)
        .await
        .unwrap();
    let client = db.client().await;
    // The functions written in SQL or PL/pgSQL, not an extension's.
    let running: BTreeMap<String, String> = client
        .query(
            "SELECT p.proname::text, p.prosrc
             FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             JOIN pg_language l ON l.oid = p.prolang
             WHERE n.nspname = current_schema() AND l.lanname IN ('sql', 'plpgsql')
               AND NOT EXISTS (SELECT 1 FROM pg_depend d
                               WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                 AND d.deptype = 'e')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        running.keys().collect::<Vec<_>>(),
        live.keys().collect::<Vec<_>>(),
        "the functions in the database are those of the live files, once each"
    );
    for (name, (owner, body)) in &live {
        assert_eq!(&running[name], body, "{name} runs its {owner} file's body");
    }
}

#[test]
fn no_versioned_migration_after_the_live_files_defines_a_function() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (dir, last) in LAST_WITH_FUNCTIONS {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some(version) = name
                .strip_prefix('V')
                .and_then(|rest| rest.split_once("__"))
                .and_then(|(version, _)| version.parse::<u32>().ok())
            else {
                continue;
            };
            let sql = std::fs::read_to_string(&path).unwrap().to_uppercase();
            let defines =
                sql.contains("CREATE FUNCTION") || sql.contains("CREATE OR REPLACE FUNCTION");
            assert!(
                version <= last || !defines,
                "{dir}/{name} defines a function: its body belongs in {dir}/functions/"
            );
        }
    }
}

/// A start that changes nothing replaces nothing; a changed file is applied
/// again, whole, in one transaction.
#[tokio::test]
async fn a_live_file_is_applied_when_it_changed() {
    let db = TestDatabase::create().await;
    let mut settings = helpers::test_layer();
    settings.database.url = db.url.clone().into();
    stagedoor_checkout::db::migrate(&settings.database)
        .await
        .unwrap();
    let mut client = db.client().await;
    let replace = idempotency::replace_functions;
    assert!(
        !replace(&mut client, "checkout", SERVICE, false)
            .await
            .unwrap(),
        "unchanged: left alone"
    );
    let changed = SERVICE.replace(
        "RETURN NEXT settled;",
        "RAISE NOTICE 'settled'; RETURN NEXT settled;",
    );
    assert!(
        replace(&mut client, "checkout", &changed, false)
            .await
            .unwrap(),
        "changed: applied"
    );
    assert!(
        !replace(&mut client, "checkout", &changed, false)
            .await
            .unwrap(),
        "applied once"
    );
    let body: String = client
        .query_one(
            "SELECT prosrc FROM pg_proc WHERE proname = 'checkout_settle_order'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(body.contains("RAISE NOTICE 'settled'"), "{body}");

    // A file that fails is not applied in part, and is tried again.
    let broken = format!(
        "{SERVICE}\nCREATE OR REPLACE FUNCTION broken() RETURNS int AS $$ nope $$ LANGUAGE sql;"
    );
    assert!(replace(&mut client, "checkout", &broken, false)
        .await
        .is_err());
    let body: String = client
        .query_one(
            "SELECT prosrc FROM pg_proc WHERE proname = 'checkout_settle_order'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        body.contains("RAISE NOTICE 'settled'"),
        "the failed file changed nothing"
    );
}

/// A replaced function is the body every node runs: on Citus the claim is
/// distributed (it runs whole on the buyer's worker), and the replacement
/// reaches each worker's copy; on one PostgreSQL there is the one node.
#[tokio::test]
async fn a_replaced_function_is_the_body_every_node_runs() {
    let app = helpers::spawn_app().await;
    let mut client = app.db.client().await;
    let changed = ENGINE.replace(
        "PERFORM set_config('synchronous_commit', 'off', true);",
        "PERFORM set_config('synchronous_commit', 'off', true); -- replaced",
    );
    assert_ne!(changed, ENGINE);
    assert!(
        idempotency::replace_functions(&mut client, "idempotency", &changed, false)
            .await
            .unwrap()
    );
    const BODY: &str = "SELECT prosrc FROM pg_proc WHERE proname = 'idempotency_claim'";
    let bodies: Vec<String> = if test_support::citus::enabled() {
        client
            .query("SELECT result FROM run_command_on_workers($1)", &[&BODY])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    } else {
        vec![client.query_one(BODY, &[]).await.unwrap().get(0)]
    };
    assert!(!bodies.is_empty());
    for body in &bodies {
        assert!(body.contains("-- replaced"), "{body}");
    }
}
