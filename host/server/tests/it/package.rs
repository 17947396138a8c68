//! One-file packages: packing is deterministic, and installing refuses
//! every package that is damaged, unsafe or not what it claims.

use std::io::Write;
use std::path::{Path, PathBuf};

use expect_test::{expect, Expect};
use flate2::write::GzEncoder;
use hangar::package;

use crate::fixtures::{lib_file, manifest, Scenario};

/// A package of the alpha example, and the scenario it lives in.
fn alpha_package(s: &Scenario) -> PathBuf {
    let dir = s.plugin(
        "alpha",
        &manifest("alpha", "engine_alpha", &["mlx"], 1, "[aliases]\nsafetensors = \"mlx\"\n[capabilities]\nkv_cache_quantization = \">=1.0\"\npaged_attention = \">=2.0\"\n"),
        Some("engine_alpha"),
    );
    let out = s.root.path().join("alpha.tar.gz");
    package::pack(&dir, &out).unwrap();
    out
}

/// The files of a package: name inside the archive, contents.
fn entries(file: &Path) -> Vec<(String, Vec<u8>)> {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(file).unwrap());
    let mut archive = tar::Archive::new(gz);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut bytes).unwrap();
            (name, bytes)
        })
        .collect()
}

/// Writes a package with these entries, byte for byte as given (no path
/// checks: a hostile package has whatever names it likes). `kind` is the
/// tar entry type of each.
fn write_raw(file: &Path, entries: &[(&str, tar::EntryType, &[u8])]) {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for (name, kind, bytes) in entries {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(bytes.len() as u64);
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_cksum();
        gz.write_all(header.as_bytes()).unwrap();
        gz.write_all(bytes).unwrap();
        gz.write_all(&vec![0; (512 - bytes.len() % 512) % 512])
            .unwrap();
    }
    gz.write_all(&[0; 1024]).unwrap();
    std::fs::write(file, gz.finish().unwrap()).unwrap();
}

/// Installs `file` into the scenario's plugins dir; the snapshot is the
/// error (with the scenario's root as `$ROOT`), or `installed`.
fn check_install(s: &Scenario, file: &Path, expected: Expect) {
    let result = package::install(file, &s.plugins_dir(), false, |_| Ok(()));
    let root = s.root.path().display().to_string();
    let out = match result {
        Ok(installed) => format!("installed {}", installed.id),
        Err(e) => e.to_string().replace(&root, "$ROOT"),
    };
    expected.assert_eq(&out);
}

#[test]
fn packing_is_deterministic_and_holds_manifest_artifact_and_checksums() {
    let s = Scenario::new();
    let first = std::fs::read(alpha_package(&s)).unwrap();
    let second = std::fs::read(alpha_package(&s)).unwrap();
    assert!(first == second, "two packs of one folder differ");
    let names: Vec<String> = entries(&s.root.path().join("alpha.tar.gz"))
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        names,
        [
            "alpha/SHA256SUMS".to_string(),
            format!("alpha/{}", lib_file("engine_alpha")),
            "alpha/plugin.toml".to_string(),
        ]
    );
}

#[test]
fn install_refuses_damaged_unsafe_and_mislabelled_packages() {
    let s = Scenario::new();
    let good = alpha_package(&s);
    std::fs::remove_dir_all(s.plugins_dir()).unwrap();
    let files = entries(&good);
    let file = |name: &str| {
        files
            .iter()
            .find(|(n, _)| n.ends_with(name))
            .unwrap()
            .1
            .clone()
    };
    let (sums, library, toml) = (file("SHA256SUMS"), file(".so"), file("plugin.toml"));
    let lib = format!("alpha/{}", lib_file("engine_alpha"));
    let bad = s.root.path().join("bad.tar.gz");
    use tar::EntryType::{Regular, Symlink};

    let mut damaged = library.clone();
    damaged[1000] ^= 0xff;
    write_raw(
        &bad,
        &[
            ("alpha/SHA256SUMS", Regular, &sums),
            (&lib, Regular, &damaged),
            ("alpha/plugin.toml", Regular, &toml),
        ],
    );
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: 'libengine_alpha.so' does not match its checksum; the package is damaged or was altered, download it again"],
    );

    write_raw(&bad, &[("alpha/../../evil.so", Regular, b"x")]);
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: entry 'alpha/../../evil.so' escapes the plugin folder"],
    );
    write_raw(&bad, &[("/etc/evil", Regular, b"x")]);
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: entry '/etc/evil' escapes the plugin folder"],
    );
    write_raw(&bad, &[("alpha/link", Symlink, b"")]);
    check_install(
        &s,
        &bad,
        expect![
            "$ROOT/bad.tar.gz: entry 'alpha/link' is not a plain file inside the plugin folder"
        ],
    );
    write_raw(&bad, &[("alpha/sub/file", Regular, b"x")]);
    check_install(
        &s,
        &bad,
        expect![
            "$ROOT/bad.tar.gz: entry 'alpha/sub/file' is not a plain file inside the plugin folder"
        ],
    );

    write_raw(
        &bad,
        &[
            (&lib, Regular, &library),
            ("alpha/plugin.toml", Regular, &toml),
        ],
    );
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: the package has no SHA256SUMS"],
    );
    write_raw(
        &bad,
        &[
            ("alpha/SHA256SUMS", Regular, &sums),
            (&lib, Regular, &library),
            ("alpha/plugin.toml", Regular, &toml),
            ("alpha/extra", Regular, b"x"),
        ],
    );
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: 'extra' is not listed in SHA256SUMS"],
    );

    // A valid manifest in a folder named after another id.
    let beta_lib = lib.replace("alpha/", "beta/");
    write_raw(
        &bad,
        &[
            ("beta/SHA256SUMS", Regular, &sums),
            (&beta_lib, Regular, &library),
            ("beta/plugin.toml", Regular, &toml),
        ],
    );
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: its folder is 'beta' but its plugin.toml says id 'alpha'"],
    );

    std::fs::write(&bad, "not a package").unwrap();
    check_install(
        &s,
        &bad,
        expect!["$ROOT/bad.tar.gz: not a plugin package (a .tar.gz written by `hangar plugin pack`): invalid gzip header"],
    );
    assert!(
        std::fs::read_dir(s.plugins_dir()).map_or(true, |mut d| d.next().is_none()),
        "a refused package left files behind"
    );

    check_install(&s, &good, expect!["installed alpha"]);
    // An id installed under another folder name is refused even with --force.
    std::fs::rename(
        s.plugins_dir().join("alpha"),
        s.plugins_dir().join("renamed"),
    )
    .unwrap();
    let refused = package::install(&good, &s.plugins_dir(), true, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("already installed in")
            && refused.contains("renamed; remove that folder first"),
        "{refused}"
    );
}
