//! What the binary's unit tests share: rows of the lock table as a test
//! writes them.

use leaderd_store::ElectionRow;

/// A row of election `name`, held by `holder` (instance `0/<holder>`) or
/// free, with `remaining_us` of its lease left by the database's clock.
pub fn row(name: &str, holder: Option<&str>, remaining_us: i64) -> ElectionRow {
    ElectionRow {
        name: name.to_owned(),
        holder: holder.map(str::to_owned),
        token: 1,
        remaining_us,
        instance: holder.map(|h| format!("0/{h}")),
        held_us: 0,
        address: None,
        successor: None,
    }
}
