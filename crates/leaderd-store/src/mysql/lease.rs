//! Acquire-or-renew on MySQL/MariaDB: the read-first operations
//! (`shared::cas`) for one election and for many, with takeovers of many
//! rows split into parts a statement carries, and a row locked elsewhere
//! answered as that row's alone.

use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use leaderd_core::Observed;

use super::statements::*;
use super::store::MysqlStore;
use super::wake::names_json;
use crate::shared::cas::{CasBatch, CasOps};
use crate::shared::error::StoreError;
use crate::shared::lease::{as_heir, observed, LeaseRequest};
use crate::shared::sql::{Bind, Stmt};

/// A row-lock wait that the statement's own bound cut short (error 1205):
/// another transaction holds the row. Or a deadlock (1213, MySQL, whose
/// statements wait for row locks; see [`Sql`]): the statement was rolled
/// back, as after a lock wait.
pub(super) fn lock_busy(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("Lock wait timeout") || info.message().contains("Deadlock found"))
}

/// A row lock held elsewhere ([`lock_busy`]) is [`StoreError::Busy`], the
/// row's own answer: on a renewal, another session's lock on the lease row;
/// on a create, the election's fence row, locked by an app's open fenced
/// transaction (its trigger writes it).
pub(super) fn busy_or(e: diesel::result::Error) -> StoreError {
    if lock_busy(&e) {
        StoreError::Busy
    } else {
        e.into()
    }
}

impl CasOps for MysqlStore {
    /// One statement per [`RENEW_MANY_MAX`] leases. When one matches fewer
    /// rows than it carries, each half is sent again, down to single leases,
    /// to learn which (renewing one twice is harmless: same token, a later
    /// expiry): one lease lost costs about 2 log2(n) statements, not n. A
    /// part refused as busy (a row locked elsewhere) is answered "not
    /// renewed", so each of its leases goes alone and only the locked one is
    /// answered busy.
    async fn renew_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut out = vec![false; items.len()];
        let mut parts: Vec<std::ops::Range<usize>> = (0..items.len())
            .step_by(RENEW_MANY_MAX)
            .map(|start| start..(start + RENEW_MANY_MAX).min(items.len()))
            .collect();
        while let Some(part) = parts.pop() {
            match self.renew_together(&items[part.clone()]).await {
                Ok(n) if n == part.len() => out[part].fill(true),
                Ok(n) if n > 0 && part.len() > 1 => {
                    let mid = part.start + part.len() / 2;
                    parts.extend([part.start..mid, mid..part.end]);
                }
                // None of them: not renewed.
                Ok(_) => {}
                Err(e) if lock_busy(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    async fn renew(&mut self, req: &LeaseRequest<'_>, token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&RENEW),
            [
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::Text(req.instance),
                Bind::BigInt(token),
            ],
        )
        .execute(&mut self.conn)
        .await
        .map_err(busy_or)?;
        Ok(n > 0)
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let rows: Vec<SeenRow> =
            Stmt::<SeenSql>::new(self.sql(&OBSERVE), [Bind::Text(req.election)])
                .load(&mut self.conn)
                .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|(h, i, t, r, a, s)| as_heir(req, observed((h, i, t, r, a)), s.as_deref())))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&TAKE),
            [
                Bind::Text(req.holder),
                Bind::Text(req.instance),
                req.address.map_or(Bind::NullText, Bind::Text),
                Bind::Text(req.instance),
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::BigInt(seen_token),
                req.daemon.map_or(Bind::NullText, Bind::Text),
            ],
        )
        .execute(&mut self.conn)
        .await;
        match n {
            Ok(n) => Ok(n > 0),
            // Another taker holds the row mid-take: a lost race, which the
            // caller reports as the refusal it is.
            Err(e) if lock_busy(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError> {
        Stmt::<()>::new(
            self.sql(&CREATE),
            [
                Bind::Text(req.election),
                Bind::Text(req.election),
                Bind::BigInt(req.block_us()),
            ],
        )
        .execute(&mut self.conn)
        .await
        .map_err(busy_or)?;
        Ok(())
    }
}

impl CasBatch for MysqlStore {
    /// One statement for all: a server 150 ms away would otherwise spend a
    /// round trip per election, and a handful of followers' attempts ran
    /// past their budget (cut, and retried, for ever).
    async fn observe_all(
        &mut self,
        reqs: &[&LeaseRequest<'_>],
    ) -> Result<Vec<Option<Observed>>, StoreError> {
        if let [req] = reqs {
            return Ok(vec![self.observe(req).await?]);
        }
        let names: Vec<&str> = reqs.iter().map(|r| r.election).collect();
        let names = names_json(&names);
        // Place, then the row as [`OBSERVE`] reads it.
        let rows: Vec<(i64, SeenRow)> =
            Stmt::<(BigInt, SeenSql)>::new(self.sql(&OBSERVE_ALL), [Bind::Text(&names)])
                .load(&mut self.conn)
                .await?;
        let mut out = vec![None; reqs.len()];
        for (place, (holder, instance, token, remaining_us, address, successor)) in rows {
            let Some(i) = usize::try_from(place - 1).ok().filter(|&i| i < reqs.len()) else {
                continue;
            };
            out[i] = Some(as_heir(
                reqs[i],
                observed((holder, instance, token, remaining_us, address)),
                successor.as_deref(),
            ));
        }
        Ok(out)
    }

    /// One statement for all. When it matched fewer rows than it carries
    /// (another replica took one first), the rows are read again, and one
    /// now on this request's instance with the next token is renewed
    /// before it is counted as taken: this statement may not be what put
    /// it there (an earlier one of this instance, given up on but still
    /// running on the server, may have, with an expiry counted from its own
    /// start, long past), while the renewal's expiry counts from now. When
    /// a row was locked elsewhere (the statement refused whole), those still
    /// open go alone, as before batches: only the locked one is refused.
    async fn take_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        if items.len() <= TAKE_MANY_MAX {
            return self.take_part(items).await;
        }
        // In name order across the parts too, as each part locks its rows.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_unstable_by_key(|&i| items[i].0.election.as_bytes());
        let mut out = vec![false; items.len()];
        for part in order.chunks(TAKE_MANY_MAX) {
            let chunk: Vec<(&LeaseRequest<'_>, i64)> = part.iter().map(|&i| items[i]).collect();
            for (&i, took) in part.iter().zip(self.take_part(&chunk).await?) {
                out[i] = took;
            }
        }
        Ok(out)
    }

    async fn create_all(&mut self, reqs: &[&LeaseRequest<'_>]) -> Result<(), StoreError> {
        let rows: Vec<(&str, i64)> = reqs.iter().map(|r| (r.election, r.block_us())).collect();
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        Stmt::<()>::new(self.sql(&CREATE_ALL), [Bind::Text(&rows)])
            .execute(&mut self.conn)
            .await
            .map_err(busy_or)?;
        Ok(())
    }
}

impl MysqlStore {
    /// [`CasOps::take_all`] for at most [`TAKE_MANY_MAX`] rows: one
    /// statement.
    async fn take_part(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        if let [(req, seen)] = items {
            return Ok(vec![self.take(req, *seen).await?]);
        }
        type TakeRow<'a> = (
            &'a str,
            &'a str,
            &'a str,
            i64,
            Option<&'a str>,
            Option<&'a str>,
        );
        let mut rows: Vec<TakeRow<'_>> = items
            .iter()
            .map(|(req, seen)| {
                let r = req;
                (r.election, r.holder, r.instance, *seen, r.daemon, r.address)
            })
            .collect();
        rows.sort_unstable_by_key(|r| r.0.as_bytes());
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        let n = Stmt::<()>::new(
            self.sql(&TAKE_ALL),
            [Bind::Text(&rows), Bind::BigInt(items[0].0.ttl_us())],
        )
        .execute(&mut self.conn)
        .await;
        match n {
            Ok(n) if n == items.len() => return Ok(vec![true; items.len()]),
            Ok(_) => {}
            Err(e) if lock_busy(&e) => return self.take_each_still_open(items).await,
            Err(e) => return Err(e.into()),
        }
        let reqs: Vec<&LeaseRequest<'_>> = items.iter().map(|(r, _)| *r).collect();
        let now = self.observe_all(&reqs).await?;
        let ours: Vec<(&LeaseRequest<'_>, i64)> = items
            .iter()
            .zip(&now)
            .filter(|((req, seen), row)| {
                row.as_ref().is_some_and(|o| {
                    o.instance.as_deref() == Some(req.instance) && o.token == seen + 1
                })
            })
            .map(|((req, seen), _)| (*req, seen + 1))
            .collect();
        let renewed = if ours.is_empty() {
            Vec::new()
        } else {
            self.renew_all(&ours).await?
        };
        let confirmed: std::collections::HashSet<&str> = ours
            .iter()
            .zip(renewed)
            .filter_map(|((req, _), ok)| ok.then_some(req.election))
            .collect();
        Ok(items
            .iter()
            .map(|(req, _)| confirmed.contains(req.election))
            .collect())
    }
}

impl MysqlStore {
    /// After a batch take refused whole (a row locked elsewhere, or a
    /// metadata lock): the rows read again in one statement, and only those
    /// still expired on the token seen taken, one by one (a rival taker
    /// that caused the refusal has usually taken the rest by now).
    async fn take_each_still_open(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let reqs: Vec<&LeaseRequest<'_>> = items.iter().map(|(r, _)| *r).collect();
        let now = self.observe_all(&reqs).await?;
        let mut out = Vec::with_capacity(items.len());
        for ((req, seen), row) in items.iter().zip(now) {
            let open = row.is_some_and(|o| o.token == *seen && o.remaining_us <= 0);
            out.push(open && self.take(req, *seen).await?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    //! Against the local MariaDB (127.0.0.1:3306, `root`, no password), in
    //! a database of its own.
    use super::*;
    use crate::mysql::scratch::migrated;
    use diesel_async::SimpleAsyncConnection;

    fn req<'a>(election: &'a str, holder: &'a str, instance: &'a str) -> LeaseRequest<'a> {
        LeaseRequest {
            election,
            holder,
            instance,
            ttl: std::time::Duration::from_secs(30),
            held_token: None,
            daemon: None,
            address: None,
        }
    }

    /// Requests for elections e1, e2 and e3.
    fn three<'a>(holder: &'a str, instance: &'a str) -> [LeaseRequest<'a>; 3] {
        ["e1", "e2", "e3"].map(|e| req(e, holder, instance))
    }

    /// Rows created expired at once (a ttl of zero blocks them for nothing),
    /// and the tokens they were seen with.
    async fn expired_rows(a: &mut MysqlStore, reqs: &[&LeaseRequest<'_>]) -> Vec<i64> {
        let at_once: Vec<LeaseRequest<'_>> = reqs
            .iter()
            .map(|r| LeaseRequest {
                ttl: std::time::Duration::ZERO,
                ..**r
            })
            .collect();
        a.create_all(&at_once.iter().collect::<Vec<_>>())
            .await
            .unwrap();
        a.observe_all(reqs)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.expect("created").token)
            .collect()
    }

    /// More expired rows than one takeover statement carries, with long
    /// multi-byte addresses: all taken, each answer in its request's place
    /// (the parts go in name order, not the requests').
    #[tokio::test]
    async fn a_takeover_of_more_rows_than_a_statement_carries_goes_in_parts() {
        let (url, _sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let address = "日".repeat(crate::shared::lease::MAX_ADDRESS_CHARS);
        // Names in reverse order, so the parts' order is not the requests'.
        let names: Vec<String> = (0..TAKE_MANY_MAX + 3)
            .rev()
            .map(|i| format!("e{i:05}"))
            .collect();
        let reqs: Vec<LeaseRequest<'_>> = names
            .iter()
            .map(|n| LeaseRequest {
                address: Some(&address),
                ..req(n, "a", "ia")
            })
            .collect();
        let refs: Vec<&LeaseRequest<'_>> = reqs.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        // One row is taken by another first: answered false, in its place.
        let mut b = MysqlStore::connect(&url).await.unwrap();
        let stolen = 7;
        assert!(b
            .take(&req(&names[stolen], "b", "ib"), seen[stolen])
            .await
            .unwrap());
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen).collect();
        let took = a.take_all(&items).await.unwrap();
        assert_eq!(took.len(), items.len());
        for (i, t) in took.iter().enumerate() {
            assert_eq!(*t, i != stolen, "{}", names[i]);
        }
        let now = a.observe_all(&refs).await.unwrap();
        for (i, row) in now.iter().enumerate() {
            let row = row.as_ref().expect("the row");
            let holder = if i == stolen { "ib" } else { "ia" };
            assert_eq!(row.instance.as_deref(), Some(holder), "{}", names[i]);
            if i != stolen {
                assert_eq!(row.address.as_deref(), Some(address.as_str()));
            }
        }
        dropper.drop_now().await;
    }

    /// A batch take that loses one row to another taker between its read
    /// and its write learns which ones it took by reading them again: its
    /// own instance with the next token, and still live (renewed).
    #[tokio::test]
    async fn a_batch_take_that_loses_a_race_says_which_rows_it_took() {
        let (url, _sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let mut b = MysqlStore::connect(&url).await.unwrap();
        let ours = three("a", "ia");
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        // B takes e2 between A's read and A's take.
        assert!(b.take(&req("e2", "b", "ib"), seen[1]).await.unwrap());
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen.clone()).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true, false, true]);
        let now = a.observe_all(&refs).await.unwrap();
        let holders: Vec<(Option<String>, i64, bool)> = now
            .into_iter()
            .map(|o| {
                o.map(|o| (o.instance, o.token, o.remaining_us > 0))
                    .unwrap()
            })
            .collect();
        assert_eq!(
            holders,
            [
                (Some("ia".to_owned()), seen[0] + 1, true),
                (Some("ib".to_owned()), seen[1] + 1, true),
                (Some("ia".to_owned()), seen[2] + 1, true),
            ]
        );
        dropper.drop_now().await;
    }

    /// A row locked elsewhere (an operator's `SELECT … FOR UPDATE`) refuses
    /// the whole batch take on MariaDB (a lock wait of 0): the rows then go
    /// one by one, and only the locked one is not taken.
    #[tokio::test]
    async fn a_locked_row_costs_a_batch_take_that_row_only() {
        let (url, mut sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let ours = three("a", "ia");
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        sql.batch_execute("BEGIN; SELECT * FROM service_leader_lock WHERE name = 'e2' FOR UPDATE")
            .await
            .unwrap();
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true, false, true]);
        sql.batch_execute("ROLLBACK").await.unwrap();
        let rows: Vec<(Option<String>, i64)> = a
            .observe_all(&refs)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.map(|o| (o.instance, o.token)).unwrap())
            .collect();
        let ia = Some("ia".to_owned());
        let want = [
            (ia.clone(), items[0].1 + 1),
            (None, items[1].1),
            (ia, items[2].1 + 1),
        ];
        assert_eq!(rows, want);
        dropper.drop_now().await;
    }

    /// A batch release on MariaDB refused as a whole by a row locked
    /// elsewhere (a lock wait of 0: at once) goes one by one: the locked
    /// row alone is answered busy, the others are released.
    #[tokio::test]
    async fn a_locked_row_costs_a_batch_release_that_row_only() {
        let (url, mut sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let ours = three("a", "ia");
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true; 3]);
        let rel = |election| crate::shared::lease::Release {
            election,
            instance: "ia",
            successor: None,
        };
        sql.batch_execute("BEGIN; SELECT * FROM service_leader_lock WHERE name = 'e2' FOR UPDATE")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let all = [rel("e1"), rel("e2"), rel("e3")];
        let released = a.release_many(&all).await.unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(
            matches!(
                released.as_slice(),
                [Ok(true), Err(StoreError::Busy), Ok(true)]
            ),
            "{released:?}"
        );
        sql.batch_execute("ROLLBACK").await.unwrap();
        let held: Vec<Option<String>> = a
            .observe_all(&refs)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.unwrap().instance)
            .collect();
        assert_eq!(held, [None, Some("ia".to_owned()), None]);
        assert!(matches!(
            a.release_many(&all[1..2]).await.unwrap().as_slice(),
            [Ok(true)]
        ));
        dropper.drop_now().await;
    }

    /// A row found on this instance with the next token after a partial
    /// take may have been put there by an earlier statement of this
    /// instance, given up on but still run by the server later, with an
    /// expiry counted from that statement's start: already past. Counted as
    /// taken, it would be led while another replica may take it. It is
    /// not; the next attempt takes it with a new token.
    #[tokio::test]
    async fn a_row_left_expired_by_an_earlier_take_is_not_counted_as_taken() {
        let (url, mut sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let ours = [req("e1", "a", "ia"), req("e2", "a", "ia")];
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        // What the earlier statement did to e2: taken, long expired.
        sql.batch_execute(&format!(
            "UPDATE service_leader_lock SET token = {}, holder = 'a', instance = 'ia', \
             expires_at = UTC_TIMESTAMP(6) - INTERVAL 2 SECOND WHERE name = 'e2'",
            seen[1] + 1
        ))
        .await
        .unwrap();
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen.clone()).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true, false]);
        let e2 = a.observe_all(&refs[1..]).await.unwrap().remove(0).unwrap();
        assert!(e2.remaining_us <= 0, "e2 was renewed: {e2:?}");
        // The next attempt's take: a new token.
        assert_eq!(a.take_all(&[(refs[1], e2.token)]).await.unwrap(), [true]);
        let e2 = a.observe_all(&refs[1..]).await.unwrap().remove(0).unwrap();
        assert_eq!((e2.token, e2.remaining_us > 0), (seen[1] + 2, true));
        dropper.drop_now().await;
    }

    /// The batch statements look up the rows they name and lock nothing
    /// else, on a table of a few rows too (where the servers would rather
    /// scan it, locking every row): another replica's renewal of its own
    /// row never finds it locked (a lock wait of 0 refuses at once on
    /// MariaDB). Also the no-op runs at connect.
    #[tokio::test]
    async fn batch_statements_lock_only_the_rows_they_match() {
        let (url, mut sql, dropper) = migrated().await;
        let mut b = MysqlStore::connect(&url).await.unwrap();
        let names = ["e1", "e2", "e3", "e4", "e5"];
        let rows: Vec<LeaseRequest<'_>> = names.iter().map(|n| req(n, "b", "ib")).collect();
        let refs: Vec<&LeaseRequest<'_>> = rows.iter().collect();
        let seen = expired_rows(&mut b, &refs).await;
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen.clone()).collect();
        assert_eq!(b.take_all(&items[1..]).await.unwrap(), [true; 4]);
        sql.batch_execute("ANALYZE TABLE service_leader_lock")
            .await
            .unwrap();
        let literal = |text: &str, json: &str| {
            text.replacen('?', &format!("'{json}'"), 1)
                .replacen('?', "1000000", 1)
        };
        let held_open = [
            literal(RENEW_ALL.mariadb, r#"[["e1","ia",1]]"#),
            literal(RENEW_ALL.mariadb, "[]"),
            literal(
                TAKE_ALL.mariadb,
                &format!(r#"[["e1","a","ia",{}]]"#, seen[0]),
            ),
            literal(TAKE_ALL.mariadb, "[]"),
            literal(RELEASE_ALL.mariadb, r#"[["e2","ib",null,0]]"#),
            literal(RELEASE_ALL.mariadb, "[]"),
        ];
        for statement in held_open {
            sql.batch_execute(&format!("BEGIN; {statement}"))
                .await
                .unwrap();
            let e5 = LeaseRequest {
                held_token: Some(seen[4] + 1),
                ..rows[4]
            };
            assert!(
                b.renew(&e5, seen[4] + 1).await.unwrap(),
                "e5's renewal behind {statement}"
            );
            sql.batch_execute("ROLLBACK").await.unwrap();
        }
        dropper.drop_now().await;
    }
}
