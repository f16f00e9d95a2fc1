//! Scratch databases on the local MariaDB (127.0.0.1:3306, `root`, no
//! password) for the backend's unit tests: one of its own per test,
//! migrated, dropped at the end.

use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};

use super::connect::establish;
use super::store::MysqlStore;
use crate::shared::url::DatabaseUrl;

async fn scratch() -> (String, AsyncMysqlConnection) {
    let admin = DatabaseUrl::parse("mysql://root@127.0.0.1:3306/test").unwrap();
    let mut conn = establish(&admin).await.expect("the local MariaDB");
    let name = format!("leaderd_unit_{}", uuid::Uuid::new_v4().simple());
    conn.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    (name, conn)
}

/// A migrated scratch database: its URL, a connection to run SQL on
/// it, and a connection to drop it with.
pub(super) async fn migrated() -> (DatabaseUrl, AsyncMysqlConnection, Dropper) {
    let (name, admin) = scratch().await;
    let url = DatabaseUrl::parse(&format!("mysql://root@127.0.0.1:3306/{name}")).unwrap();
    MysqlStore::connect(&url)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let sql = establish(&url).await.unwrap();
    (url, sql, Dropper(Some((name, admin))))
}

/// Drops the scratch database at the end of a test.
pub(super) struct Dropper(Option<(String, AsyncMysqlConnection)>);

impl Dropper {
    pub(super) async fn drop_now(mut self) {
        if let Some((name, mut admin)) = self.0.take() {
            let _ = admin.batch_execute(&format!("DROP DATABASE {name}")).await;
        }
    }
}
