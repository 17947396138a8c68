//! Gemma 3's vision tower and projector on a random-weight `gemma3` folder (`scripts/make_tiny_model.py --vision`): pixel values against transformers' image processor, soft tokens against mlx-vlm (`tests/vision_reference.py`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use hangar_native_mlx::{preprocess_image, Error, LoadOptions, Model, ModelConfig, VisionEncoder};
use serde_json::{json, Value};

use crate::fixtures::{python, repo};
use crate::greedy::float32_tolerance;

/// The test images: (file name, Pillow mode, width, height, format). Shrunk
/// (not by a whole factor), kept at the tower's 32x32, enlarged; gray,
/// gray with alpha, RGBA (alpha from 0 to 255) and a palette; one JPEG; and
/// two whose passes Pillow 13 runs vertical first.
const IMAGES: [(&str, &str, u32, u32, &str); 9] = [
    ("rgb-shrunk.png", "RGB", 50, 37, "PNG"),
    ("rgb-same.png", "RGB", 32, 32, "PNG"),
    ("rgba-enlarged.png", "RGBA", 20, 12, "PNG"),
    ("gray.png", "L", 32, 64, "PNG"),
    ("gray-alpha.png", "LA", 33, 31, "PNG"),
    ("palette.png", "P", 40, 40, "PNG"),
    ("photo.jpg", "RGB", 64, 48, "JPEG"),
    ("vertical-first.png", "RGB", 45, 64, "PNG"),
    ("tall-narrow.png", "RGB", 20, 60, "PNG"),
];

/// Soft tokens must agree to float32 rounding (on a GPU, see [`close`]).
const FEATURE_TOLERANCE: f32 = 1e-4;

/// The quantized copies of the folder, as mlx-vlm converts it: (folder
/// name, bits, whether the vision tower's linear layers are quantized too;
/// mlx-vlm's own predicate keeps the tower and projector dense).
const CONVERTED: [(&str, u32, bool); 2] = [
    ("gemma3-vision-q8", 8, false),
    ("gemma3-vision-q8-tower", 8, true),
];

/// The same folder in bfloat16 (other random weights: they are drawn in
/// float32 and rounded).
const BF16: &str = "gemma3-vision-bf16";

struct Fixture {
    _dir: tempfile::TempDir,
    model: PathBuf,
    images: PathBuf,
    /// The reference's answer for each of [`IMAGES`].
    answers: Vec<Value>,
    /// For each of [`CONVERTED`], then the bfloat16 folder: mlx-vlm's soft
    /// tokens of each image.
    converted: Vec<Vec<Vec<f32>>>,
}

/// The tiny vision folder, its images and the reference, made once.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("gemma3-vision");
        let images = dir.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_model.py"))
            .arg(&model)
            .args(["--arch", "gemma3", "--vision", "--layers", "2"])
            .args(crate::fixtures::VISION_WIDTH)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "make_tiny_model.py --vision failed");
        let status = Command::new(python())
            .arg(repo().join("scripts/make_tiny_model.py"))
            .arg(dir.path().join(BF16))
            .args(["--arch", "gemma3", "--vision", "--layers", "2"])
            .args(crate::fixtures::VISION_WIDTH)
            .args(["--dtype", "bfloat16"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "make_tiny_model.py --vision --dtype bfloat16 failed"
        );
        let specs: Vec<Value> = IMAGES
            .iter()
            .enumerate()
            .map(|(i, (name, mode, width, height, format))| {
                json!({"path": images.join(name), "mode": mode, "width": width,
                    "height": height, "seed": i, "format": format})
            })
            .collect();
        let convert: Vec<Value> = CONVERTED
            .iter()
            .map(|(name, bits, tower)| {
                json!({"mlx_path": dir.path().join(name), "bits": bits, "vision": tower})
            })
            .collect();
        let answer = reference(json!({"model": model, "images": specs, "convert": convert,
            "also": [dir.path().join(BF16)]}));
        Fixture {
            answers: answer["images"].as_array().unwrap().clone(),
            converted: answer["converted"]
                .as_array()
                .unwrap()
                .iter()
                .map(|per_image| per_image.as_array().unwrap().iter().map(floats).collect())
                .collect(),
            _dir: dir,
            model,
            images,
        }
    })
}

fn reference(request: Value) -> Value {
    crate::fixtures::python_reference("vision_reference.py", &request)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Whether soft tokens differ from the reference's `want` by at most
/// `diff`: float32 rounding ([`FEATURE_TOLERANCE`]; on a GPU, TF32's).
fn close(diff: f32, want: &[f32]) -> bool {
    let largest = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    diff <= float32_tolerance(FEATURE_TOLERANCE, largest)
}

/// For image `name` of [`IMAGES`]: the largest difference of its pixel
/// values and of its soft tokens from the reference's, and whether the
/// latter is within [`close`].
fn compare(encoder: &VisionEncoder, name: &str) -> (f32, f32, bool) {
    let f = fixture();
    let i = IMAGES.iter().position(|image| image.0 == name).unwrap();
    let bytes = std::fs::read(f.images.join(name)).unwrap();
    let want = &f.answers[i];
    let pixels = preprocess_image(&bytes, encoder.config().image_size as u32).unwrap();
    let features = encoder.image_features(&bytes).unwrap();
    let (tokens, hidden) = (
        want["tokens"].as_i64().unwrap() as i32,
        want["hidden"].as_i64().unwrap() as i32,
    );
    assert_eq!(features.shape(), [tokens, hidden], "{name}");
    let got: Vec<f32> = features.as_slice::<f32>().to_vec();
    let features = floats(&want["features"]);
    let diff = max_diff(&got, &features);
    (
        max_diff(&pixels, &floats(&want["pixels"])),
        diff,
        close(diff, &features),
    )
}

/// Checks that each of `names` has the reference's pixel values exactly
/// and its soft tokens to float32 rounding; every image is compared
/// before the failures are told (a GPU run is too dear to learn one at a
/// time).
fn check_exact(encoder: &VisionEncoder, names: &[&str]) {
    let mut failures = Vec::new();
    for name in names {
        let (pixels, features, close) = compare(encoder, name);
        eprintln!("{name}: pixels {pixels:e}, soft tokens {features:e}");
        if pixels != 0.0 {
            failures.push(format!("{name}: pixel values differ by {pixels}"));
        }
        if !close {
            failures.push(format!("{name}: soft tokens differ by {features}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

fn encoder() -> VisionEncoder {
    VisionEncoder::load(&fixture().model, &LoadOptions::default()).unwrap()
}

#[test]
fn gemma3_image_soft_tokens_match_mlx_vlm() {
    let encoder = encoder();
    let config = encoder.config();
    assert_eq!(
        (
            config.image_size,
            config.mm_tokens_per_image,
            config.text_hidden_size
        ),
        (32, 4, 64)
    );
    check_exact(
        &encoder,
        &["rgb-shrunk.png", "rgb-same.png", "rgba-enlarged.png"],
    );
}

#[test]
fn gray_transparent_and_palette_pngs_become_rgb_as_the_processor_makes_them() {
    let encoder = encoder();
    check_exact(&encoder, &["gray.png", "gray-alpha.png", "palette.png"]);
}

#[test]
fn a_jpeg_decodes_close_to_pillow() {
    // Not bit for bit: the `image` crate's JPEG decoder is not libjpeg-turbo.
    let (pixels, features, _) = compare(&encoder(), "photo.jpg");
    eprintln!("photo.jpg: pixels {pixels:e}, soft tokens {features:e}");
    assert!(
        pixels <= 4.0 / 255.0 * 2.0,
        "JPEG pixels differ by {pixels}"
    );
}

#[test]
fn a_corrupt_image_is_a_clear_error() {
    let encoder = encoder();
    let png = std::fs::read(fixture().images.join("rgb-same.png")).unwrap();
    let truncated = &png[..png.len() / 2];
    let cases: [(&str, &[u8]); 3] = [
        ("truncated PNG", truncated),
        ("not an image", b"GIF89a? no, just text"),
        ("empty", b""),
    ];
    for (what, bytes) in cases {
        match encoder.image_features(bytes) {
            Err(e @ Error::Image(_)) => {
                let message = e.to_string();
                assert!(
                    message.contains("PNG, JPEG, GIF, WebP or BMP"),
                    "{what}: {message}"
                );
            }
            Err(e) => panic!("{what}: not an image error: {e}"),
            Ok(_) => panic!("{what}: decoded"),
        }
    }
}

#[test]
fn resizes_that_pillow_13_runs_vertically_first_match_too() {
    // Pillow 13 starts with the vertical pass where the height loses more
    // than twice the pixels the width loses (Pillow 12 never did); the order
    // changes the rounding of the intermediate image.
    check_exact(&encoder(), &["vertical-first.png", "tall-narrow.png"]);
}

#[test]
fn quantized_gemma3_folders_match_mlx_vlm() {
    // mlx-vlm's layout: the patch kernel channels-last; the text model
    // 8-bit; in the second folder the tower's linear layers 8-bit as well.
    let f = fixture();
    let root = f.model.parent().unwrap();
    let mut failures = Vec::new();
    for (c, (name, ..)) in CONVERTED.iter().enumerate() {
        let encoder = VisionEncoder::load(&root.join(name), &LoadOptions::default()).unwrap();
        for (i, (image, ..)) in IMAGES.iter().enumerate().take(3) {
            let bytes = std::fs::read(f.images.join(image)).unwrap();
            let features = encoder.image_features(&bytes).unwrap();
            let diff = max_diff(features.as_slice::<f32>(), &f.converted[c][i]);
            eprintln!("{name} {image}: soft tokens {diff:e}");
            if !close(diff, &f.converted[c][i]) {
                failures.push(format!("{name} {image}: soft tokens differ by {diff}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

#[test]
fn the_text_model_of_a_vision_folder_still_loads() {
    let f = fixture();
    let root = f.model.parent().unwrap();
    for dir in [f.model.clone(), root.join(CONVERTED[1].0)] {
        let config = ModelConfig::load(&dir).unwrap();
        Model::load(&dir, config, &LoadOptions::default()).unwrap();
    }
}

#[test]
fn a_bfloat16_folder_matches_mlx_vlm_to_its_rounding() {
    // Pixels and weights in bfloat16 as mlx-vlm casts them; the patch
    // embedding is a product here and a convolution there, which round
    // differently in bfloat16 (8 bits of mantissa: one step of a value
    // near 4 is 1/32).
    let f = fixture();
    let dir = f.model.parent().unwrap().join(BF16);
    let encoder = VisionEncoder::load(&dir, &LoadOptions::default()).unwrap();
    for (i, (image, ..)) in IMAGES.iter().enumerate().take(3) {
        let bytes = std::fs::read(f.images.join(image)).unwrap();
        let features = encoder.image_features(&bytes).unwrap();
        assert_eq!(features.dtype(), mlx_rs::Dtype::Bfloat16);
        let features = features.as_dtype(mlx_rs::Dtype::Float32).unwrap();
        let want = &f.converted[CONVERTED.len()][i];
        let diff = max_diff(features.as_slice::<f32>(), want);
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        eprintln!("bfloat16 {image}: soft tokens {diff:e} (largest {scale})");
        assert!(
            diff <= 0.05 * scale,
            "{image}: soft tokens differ by {diff}"
        );
    }
}
