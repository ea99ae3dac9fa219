//! The invariants (docs/DESIGN.md, "What always holds"), checked at the end of tests
//! by the same checker as the chaos run (`test_support::invariants`), against
//! the test's database and the sandbox's ledger (the truth about charges).

use test_support::invariants;

use crate::helpers::TestApp;

/// Panics with every violation found, each naming the rows involved.
pub async fn assert_invariants(app: &TestApp) {
    let db = app.db.client().await;
    let ledger = app.charges().await;
    let violations = invariants::violations(&db, &ledger).await;
    assert!(
        violations.is_empty(),
        "invariants violated:\n  {}",
        violations.join("\n  ")
    );
}
