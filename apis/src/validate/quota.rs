//! FleetQuota checks beyond the schema: the classes its limits name exist, and no two limits
//! count the same devices.

use super::{Set, Sink};
use crate::quota::FleetQuotaSpec;

pub(super) fn check_quota<'a>(sink: &mut Sink<'a>, spec: &FleetQuotaSpec, set: &Set<'a>) {
    for (i, limit) in spec.devices.iter().enumerate() {
        if let Some(class) = &limit.class
            && !set.known_class(class)
        {
            sink.error(format!("spec.devices[{i}].class"), set.unknown_class(class));
        }
    }
    for (i, j) in spec.counted_twice() {
        let (limit, other) = (&spec.devices[i], &spec.devices[j]);
        sink.error(
            format!("spec.devices[{i}]"),
            format!(
                "limits the same {} as spec.devices[{j}]: keep one (the lower, {}, would bind)",
                limit.subject(),
                limit.max.min(other.max)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{CLASS, fields, parse};
    use crate::document::FleetObject;
    use crate::validate::validate_set;

    fn quota(devices: &str) -> String {
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: FleetQuota\nmetadata: {{name: gpus, namespace: ml}}\nspec:\n  devices: {devices}\n"
        )
    }

    fn problems_of(devices: &str) -> Vec<(crate::document::Severity, String, String)> {
        let objects = parse(&[CLASS, &quota(devices)]);
        assert!(matches!(objects[1].value, FleetObject::Quota(_)));
        validate_set(&objects, &[]).into_iter().map(|p| (p.severity, p.field, p.message)).collect()
    }

    #[test]
    fn an_unknown_class_and_a_limit_counted_twice_are_errors_naming_the_field() {
        let p = problems_of("[{class: a100, max: 8}, {class: h100, max: 8}, {class: h100, max: 4}]");
        assert_eq!(fields(&p), ["spec.devices[0].class", "spec.devices[2]"], "{p:#?}");
        assert!(p[0].2.starts_with("unknown InferenceClass \"a100\""), "{}", p[0].2);
        assert!(p[1].2.contains("as spec.devices[1]") && p[1].2.contains("the lower, 4, would bind"), "{}", p[1].2);
        // Twin: the same class per capacity type, and a limit of every class, are distinct.
        assert!(
            problems_of("[{class: h100, max: 8}, {class: h100, capacityType: spot, max: 4}, {max: 16}]").is_empty()
        );
    }
}
