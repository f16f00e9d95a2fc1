//! Reading a tokio-postgres row into a tuple, column by column, as diesel
//! does for the other backends: the row types are written once (in
//! `shared`), not again as a list of `try_get`s per statement.

use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

/// A tuple read from a row's columns in order.
pub(super) trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error>;
}

macro_rules! tuple_from_row {
    ($($i:tt $t:ident),+) => {
        impl<$($t),+> FromRow for ($($t,)+)
        where
            $($t: for<'a> FromSql<'a>),+
        {
            fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
                Ok(($(row.try_get($i)?,)+))
            }
        }
    };
}

// An election's row; a term of the record.
tuple_from_row!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H);
tuple_from_row!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L);
