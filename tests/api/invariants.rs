//! SPEC §9, checked at the end of tests by the same checker as the chaos run
//! (`tests/chaos/spec9.rs`), against the test's database and the sandbox's
//! ledger (the truth about charges).

#[path = "../chaos/spec9.rs"]
mod spec9;

use crate::helpers::TestApp;

/// Panics with every violation found, each naming the rows involved.
pub async fn assert_invariants(app: &TestApp) {
    let db = app.db.client().await;
    let ledger = app.charges().await;
    let violations = spec9::violations(&db, &ledger).await;
    assert!(
        violations.is_empty(),
        "SPEC §9 violations:\n  {}",
        violations.join("\n  ")
    );
}
