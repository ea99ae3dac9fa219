//! The two values of an order that are not free text: its status, stored as
//! the text the API shows, and the payment method, checked at the door.

use serde::Serialize;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

use super::InvalidOrder;

/// Where an order is on its way to an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Written before Payrail was asked; settled by whoever gets the answer.
    PaymentPending,
    Paid,
    Declined,
    /// Payrail never decided; the charge was canceled there, the holds given back.
    Failed,
}

impl OrderStatus {
    /// The text the API and the `orders.status` column use.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::PaymentPending => "payment_pending",
            OrderStatus::Paid => "paid",
            OrderStatus::Declined => "declined",
            OrderStatus::Failed => "failed",
        }
    }
}

impl<'a> FromSql<'a> for OrderStatus {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match <&str as FromSql>::from_sql(ty, raw)? {
            "payment_pending" => Ok(OrderStatus::PaymentPending),
            "paid" => Ok(OrderStatus::Paid),
            "declined" => Ok(OrderStatus::Declined),
            "failed" => Ok(OrderStatus::Failed),
            other => Err(format!("unknown order status {other:?}").into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

impl ToSql for OrderStatus {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.as_str().to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// A payment method as Payrail names it: `pm_` and then letters, digits and
/// `_`, 64 characters at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentMethod(String);

impl PaymentMethod {
    pub fn parse(raw: &str) -> Result<Self, InvalidOrder> {
        let valid = raw.len() <= 64
            && raw.strip_prefix("pm_").is_some_and(|rest| {
                !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
            });
        if !valid {
            return Err(InvalidOrder(
                "payment_method must look like pm_… (letters, digits, '_'; at most 64)",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// One read back from an order row, which only ever holds parsed ones.
    pub(super) fn trusted(raw: String) -> Self {
        Self(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payment_method_is_pm_and_a_word() {
        for bad in [
            "card_visa",
            "pm_",
            "pm_card visa",
            "pm_café",
            &format!("pm_{}", "x".repeat(62)),
        ] {
            assert!(PaymentMethod::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            PaymentMethod::parse("pm_card_visa").unwrap().as_str(),
            "pm_card_visa"
        );
    }

    #[test]
    fn a_status_is_written_as_the_api_shows_it() {
        for status in [
            OrderStatus::PaymentPending,
            OrderStatus::Paid,
            OrderStatus::Declined,
            OrderStatus::Failed,
        ] {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
    }
}
