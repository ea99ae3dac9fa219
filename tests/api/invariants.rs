//! The invariants (README, "What always holds"), checked at the end of tests
//! by the same checker as the chaos run (`tests/chaos/invariants.rs`), against
//! the test's database and the sandbox's ledger (the truth about charges).

#[path = "../chaos/invariants.rs"]
mod checker;

use crate::helpers::TestApp;

/// Panics with every violation found, each naming the rows involved.
pub async fn assert_invariants(app: &TestApp) {
    let db = app.db.client().await;
    let ledger = app.charges().await;
    let violations = checker::violations(&db, &ledger).await;
    assert!(
        violations.is_empty(),
        "invariants violated:\n  {}",
        violations.join("\n  ")
    );
}
