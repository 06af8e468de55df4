//! Turning the configuration into a plan: ConfigMap -> env (the policy's `env`) -> plan (its
//! `plan`), or `ADDON_*` environment input straight to `plan`. The one way in for
//! `preview`, `install` and the daemon.

use crate::configmap::Input;
use crate::policy::{KeyValue, NodeOptions, Plan, Policy, PolicyError};

/// Runs the policy on the configuration for kata-deploy's default prefix.
pub(crate) fn of_default_prefix(policy: &Policy, input: &Input) -> Result<(Vec<KeyValue>, Plan), PolicyError> {
    of(policy, input, kata_addons_facts::DEFAULT_KATA_PREFIX)
}

/// Runs the policy on the configuration for kata-deploy's installation prefix
/// `kata_prefix` (`--kata-prefix`): the resolved env and the plan.
pub(crate) fn of(policy: &Policy, input: &Input, kata_prefix: &str) -> Result<(Vec<KeyValue>, Plan), PolicyError> {
    let env = match input {
        Input::ConfigMap { data, .. } => policy.env(data)?,
        // The values `plan` acts on: the policy's own trimming (all-blank = empty, which the
        // policy treats as absent), so `preview` echoes what install uses. Names are kept,
        // so an unknown `ADDON_*` name is still reported whatever its value.
        Input::Env(env) => env
            .iter()
            .map(|kv| KeyValue {
                name: kv.name.clone(),
                value: kata_addons_facts::trimmed(&kv.value).unwrap_or_default().to_string(),
            })
            .collect(),
    };
    let plan = policy.plan_for(&env, &NodeOptions { kata_prefix: kata_prefix.to_string() })?;
    Ok((env, plan))
}
