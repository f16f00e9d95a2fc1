//! Releases on MySQL/MariaDB: one election's, and a batch's in one
//! statement, with a row locked elsewhere answered as that release's alone;
//! and a named successor's giving up of its turn.

use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;

use super::lease::{busy_or, lock_busy};
use super::statements::{DECLINE, FREE_OF, RELEASE, RELEASE_ALL, RELEASE_MANY_MAX};
use super::store::MysqlStore;
use crate::shared::error::{row_answer, StoreError};
use crate::shared::lease::Release;
use crate::shared::sql::{Bind, Stmt};

impl MysqlStore {
    /// Releases `items` (distinct elections), one statement per
    /// [`RELEASE_MANY_MAX`]; whether each was released, or
    /// [`StoreError::Busy`] for a row locked elsewhere.
    pub(crate) async fn release_many(
        &mut self,
        items: &[Release<'_>],
    ) -> Result<Vec<Result<bool, StoreError>>, StoreError> {
        let mut out = Vec::with_capacity(items.len());
        for part in items.chunks(RELEASE_MANY_MAX) {
            out.extend(self.release_part(part).await?);
        }
        Ok(out)
    }

    async fn release_part(
        &mut self,
        part: &[Release<'_>],
    ) -> Result<Vec<Result<bool, StoreError>>, StoreError> {
        let mut rows: Vec<(&str, &str, Option<&str>, i64)> = part
            .iter()
            .map(|r| {
                let successor = r.successor.map(|s| s.daemon);
                (r.election, r.instance, successor, r.window_us())
            })
            .collect();
        rows.sort_unstable_by_key(|r| r.0.as_bytes());
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        let released = Stmt::<()>::new(self.sql(&RELEASE_ALL), [Bind::Text(&rows)])
            .execute(&mut self.conn)
            .await;
        match released {
            Ok(n) if n == part.len() => Ok(part.iter().map(|_| Ok(true)).collect()),
            // Some rows were another instance's by then (a lease lost): the
            // ones released are free now, the others held. Not exact: a
            // row free already counts as released, and one its named
            // successor took since as not. The answer only picks the
            // release's log line; the rows are right either way.
            Ok(_) => {
                let names: Vec<&str> = part.iter().map(|r| r.election).collect();
                let names = serde_json::to_string(&names).expect("strings serialize");
                let free: Vec<String> = Stmt::<Text>::new(self.sql(&FREE_OF), [Bind::Text(&names)])
                    .load(&mut self.conn)
                    .await?;
                Ok(part
                    .iter()
                    .map(|r| Ok(free.iter().any(|f| f == r.election)))
                    .collect())
            }
            // A row locked elsewhere refuses the whole statement, which
            // released nothing: each alone, so that only that one fails.
            Err(e) if lock_busy(&e) => {
                let mut out = Vec::with_capacity(part.len());
                for item in part {
                    out.push(row_answer(self.release(item).await)?);
                }
                Ok(out)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Releases the row if `item`'s instance holds it; a row locked
    /// elsewhere is [`StoreError::Busy`].
    pub(crate) async fn release(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&RELEASE),
            [
                item.successor
                    .map_or(Bind::NullText, |s| Bind::Text(s.daemon)),
                Bind::BigInt(item.window_us()),
                Bind::Text(item.election),
                Bind::Text(item.instance),
            ],
        )
        .execute(&mut self.conn)
        .await
        .map_err(busy_or)?;
        Ok(n > 0)
    }

    /// Gives up being `election`'s named successor (see [`DECLINE`]):
    /// whether the row named `daemon` and is open to anyone now; a row
    /// locked elsewhere is [`StoreError::Busy`].
    pub(crate) async fn decline(
        &mut self,
        election: &str,
        daemon: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&DECLINE),
            [
                Bind::Text(election),
                Bind::Text(daemon),
                Bind::BigInt(token),
            ],
        )
        .execute(&mut self.conn)
        .await
        .map_err(busy_or)?;
        Ok(n > 0)
    }
}
