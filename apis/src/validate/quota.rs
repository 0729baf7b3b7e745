//! FleetQuota checks beyond the schema: the classes its limits name exist, and no two limits
//! count the same devices.

use super::{Set, Sink};
use crate::quota::FleetQuotaSpec;

pub(super) fn check_quota<'a>(sink: &mut Sink<'a>, spec: &FleetQuotaSpec, set: &Set<'a>) {
    for (i, limit) in spec.devices.iter().enumerate() {
        let field = format!("spec.devices[{i}]");
        if let Some(class) = &limit.class
            && !set.known_class(class)
        {
            sink.error(format!("{field}.class"), set.unknown_class(class));
        }
        if let Some(j) =
            spec.devices[..i].iter().position(|o| (&o.class, o.capacity_type) == (&limit.class, limit.capacity_type))
        {
            sink.error(
                field,
                format!(
                    "limits the same {} as spec.devices[{j}]: keep one (the lower, {}, would bind)",
                    limit.subject(),
                    limit.max.min(spec.devices[j].max)
                ),
            );
        }
    }
}
