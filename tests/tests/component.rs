//! The embedded policy component is small and imports nothing (no WASI, no host functions,
//! no instances or modules; only the names of its own fully defined WIT types).

use wasmparser::{ComponentTypeRef, Parser, Payload, TypeBounds, Validator};

#[test]
fn component_is_small() {
    let len = kata_addons::GUEST_WASM.len();
    assert!(len <= 256 * 1024, "the policy component is {len} bytes: the limit is 256 KiB");
}

#[test]
fn component_imports_nothing() {
    let wasm = kata_addons::GUEST_WASM;
    assert!(Parser::is_component(wasm), "GUEST_WASM is not a WebAssembly component");
    Validator::new().validate_all(wasm).expect("the component validates");
    let mut depth = 0usize;
    let mut imports = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.expect("parse the component") {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) => {
                for import in reader {
                    let import = import.expect("component import");
                    // Named WIT types used by the exports are encoded as imports of fully
                    // defined types (`(type (eq N))`), even when defined in the world itself:
                    // names for types, nothing the host must provide.
                    if let ComponentTypeRef::Type(TypeBounds::Eq(_)) = import.ty {
                        continue;
                    }
                    imports.push(format!("component import `{}` (depth {depth})", import.name.name));
                }
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    let import = import.expect("core import");
                    imports.push(format!("core import `{}::{}` (depth {depth})", import.module, import.name));
                }
            }
            _ => {}
        }
    }
    assert!(imports.is_empty(), "the policy component must import nothing, found:\n{}", imports.join("\n"));
}
