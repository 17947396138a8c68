//! Image bytes to the pixel values Gemma 3's vision tower reads, as transformers' `Gemma3ImageProcessorPil` (the processor mlx-vlm loads) makes them for one image.
//!
//! The processor's steps, each matched to its integer arithmetic where it
//! has some, so that 8-bit PNGs give the very same pixel values:
//!
//! 1. decode (PNG, JPEG, GIF (its first frame), WebP or BMP, through the
//!    `image` crate);
//! 2. `convert_to_rgb`: an image with alpha is composited onto opaque white
//!    with Pillow's `alpha_composite` (fixed point, 7 fraction bits); gray
//!    is replicated into three channels;
//! 3. resize to `size x size` with Pillow's `BILINEAR` resampling: a
//!    separable triangle filter whose support widens by the scale when the
//!    image shrinks (so it antialiases, as Pillow always does), coefficients
//!    in fixed point (22 fraction bits), one pass a direction in Pillow
//!    13's order, each pass rounded and clamped to 8 bits;
//! 4. rescale by `1/255` (in float64, then float32) and normalize with mean
//!    0.5 and std 0.5 (in float32).
//!
//! What does not match bit for bit: JPEG decoding (the `image` crate's
//! decoder is not libjpeg-turbo, whose IDCT and chroma upsampling Pillow
//! uses; pixels may differ by one level) and 16-bit PNGs (Pillow opens
//! 16-bit gray as `I;16`, which its RGB conversion clamps, where the `image`
//! crate keeps the high byte). EXIF orientation is not applied: the
//! processor does not apply it either (loaders in front of it may).

use image::DynamicImage;

use crate::error::{Error, Result};

/// Fraction bits of Pillow's fixed-point resampling coefficients for 8-bit
/// images (`32 - 8 - 2`: room for a sum of 8-bit values times weights).
const RESAMPLE_BITS: u32 = 22;

/// Fraction bits of Pillow's fixed-point alpha compositing.
const COMPOSITE_BITS: u32 = 7;

/// The pixel values of one image for a vision tower that reads `size x size`
/// images: `size * size * 3` float32 values, row by row, each pixel's red,
/// green and blue together (height, width, channels: the layout of MLX's
/// convolutions).
pub fn preprocess_image(bytes: &[u8], size: u32) -> Result<Vec<f32>> {
    if size == 0 {
        return Err(Error::InvalidRequest(
            "the vision tower's image size is 0".into(),
        ));
    }
    let rgb = decode_rgb(bytes)?;
    let resized = resize_bilinear(&rgb, size as usize, size as usize);
    // `rescale`: `uint8 -> float64 * (1/255) -> float32`; `normalize`:
    // `(x - 0.5) / 0.5` in float32.
    let scale = 1.0f64 / 255.0;
    Ok(resized
        .data
        .iter()
        .map(|&v| ((v as f64 * scale) as f32 - 0.5f32) / 0.5f32)
        .collect())
}

/// An 8-bit RGB image, row by row, three values a pixel.
#[derive(Clone)]
struct Rgb {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

/// Decodes PNG, JPEG, GIF, WebP or BMP bytes to RGB as the processor's
/// `convert_to_rgb` does: alpha composited onto white, gray replicated.
fn decode_rgb(bytes: &[u8]) -> Result<Rgb> {
    let image = image::load_from_memory(bytes).map_err(|e| {
        Error::Image(format!(
            "cannot decode the image ({} bytes) as PNG, JPEG, GIF, WebP or BMP: {e}",
            bytes.len()
        ))
    })?;
    let (width, height) = (image.width() as usize, image.height() as usize);
    if width == 0 || height == 0 {
        return Err(Error::Image(format!(
            "the image is {width}x{height} pixels"
        )));
    }
    let data = if image.color().has_alpha() {
        composite_on_white(&image)
    } else {
        image.to_rgb8().into_raw()
    };
    Ok(Rgb {
        width,
        height,
        data,
    })
}

/// Pillow's `alpha_composite` of the image over opaque white, in its fixed
/// point: with an opaque background the source weighs `a * 2^7` and the
/// white `(255 - a) * 2^7`, and the sum is divided by 255 with Pillow's
/// shift-and-add rounding.
fn composite_on_white(image: &DynamicImage) -> Vec<u8> {
    let rgba = image.to_rgba8();
    let mut out = Vec::with_capacity(rgba.width() as usize * rgba.height() as usize * 3);
    for pixel in rgba.pixels() {
        let [r, g, b, a] = pixel.0;
        if a == 0 {
            out.extend([255, 255, 255]);
            continue;
        }
        let source = u32::from(a) << COMPOSITE_BITS;
        let white = (255 - u32::from(a)) << COMPOSITE_BITS;
        for c in [r, g, b] {
            let t = u32::from(c) * source + 255 * white + (0x80 << COMPOSITE_BITS);
            out.push(((((t >> 8) + t) >> 8) >> COMPOSITE_BITS) as u8);
        }
    }
    out
}

/// The taps of one output pixel: the first input pixel and the fixed-point
/// weights of it and the following ones.
struct Taps {
    first: usize,
    weights: Vec<i32>,
}

/// Pillow's bilinear coefficients for resampling `input` pixels to
/// `output`: a triangle of half-width `max(1, scale)` around each output
/// pixel's center, normalized to sum to one, then rounded to fixed point.
fn bilinear_taps(input: usize, output: usize) -> Vec<Taps> {
    let scale = input as f64 / output as f64;
    let filter_scale = scale.max(1.0);
    let support = filter_scale;
    let inverse = 1.0 / filter_scale;
    let triangle = |x: f64| {
        let x = x.abs();
        if x < 1.0 {
            1.0 - x
        } else {
            0.0
        }
    };
    (0..output)
        .map(|i| {
            let center = (i as f64 + 0.5) * scale;
            // Pillow's bounds are C `(int)` casts: truncation toward zero.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let raw: Vec<f64> = (first..end.max(first))
                .map(|x| triangle((x as f64 - center + 0.5) * inverse))
                .collect();
            let total: f64 = raw.iter().sum();
            let one = f64::from(1u32 << RESAMPLE_BITS);
            let weights = raw
                .iter()
                .map(|&w| {
                    let w = if total != 0.0 { w / total } else { w } * one;
                    if w < 0.0 {
                        (w - 0.5) as i32
                    } else {
                        (w + 0.5) as i32
                    }
                })
                .collect();
            Taps { first, weights }
        })
        .collect()
}

/// One fixed-point sum of taps, rounded and clamped to 8 bits as Pillow
/// does (`1 << 21` is the rounding half).
fn clamp8(sum: i64) -> u8 {
    (sum >> RESAMPLE_BITS).clamp(0, 255) as u8
}

/// Pillow's `Image.resize(..., BILINEAR)` of an 8-bit RGB image: two
/// passes, each only where the size changes, each rounded to 8 bits.
/// Pillow 13 runs the vertical pass first when the height loses more than
/// twice as many pixels as the width (less work for the horizontal pass),
/// else the horizontal one first (as every Pillow before 13 always did);
/// the order changes the rounding of the intermediate image, so it is
/// Pillow 13's here (transformers 5.24 with mlx-vlm 0.7.6 installs it).
fn resize_bilinear(image: &Rgb, width: usize, height: usize) -> Rgb {
    let lost_height = image.height as i64 - height as i64;
    let lost_width = image.width as i64 - width as i64;
    let vertical_first = lost_height > 0 && lost_height > 2 * lost_width;
    if vertical_first {
        resize_horizontally(&resize_vertically(image, height), width)
    } else {
        resize_vertically(&resize_horizontally(image, width), height)
    }
}

/// The horizontal pass: every row resampled to `width` pixels.
fn resize_horizontally(image: &Rgb, width: usize) -> Rgb {
    if width == image.width {
        return image.clone();
    }
    let half = 1i64 << (RESAMPLE_BITS - 1);
    let taps = bilinear_taps(image.width, width);
    let mut data = Vec::with_capacity(width * image.height * 3);
    for y in 0..image.height {
        let row = &image.data[y * image.width * 3..(y + 1) * image.width * 3];
        for t in &taps {
            for c in 0..3 {
                let sum = t.weights.iter().enumerate().fold(half, |s, (k, &w)| {
                    s + i64::from(row[(t.first + k) * 3 + c]) * i64::from(w)
                });
                data.push(clamp8(sum));
            }
        }
    }
    Rgb {
        width,
        height: image.height,
        data,
    }
}

/// The vertical pass: every column resampled to `height` pixels.
fn resize_vertically(image: &Rgb, height: usize) -> Rgb {
    if height == image.height {
        return image.clone();
    }
    let half = 1i64 << (RESAMPLE_BITS - 1);
    let taps = bilinear_taps(image.height, height);
    let stride = image.width * 3;
    let mut data = Vec::with_capacity(stride * height);
    for t in &taps {
        for x in 0..stride {
            let sum = t.weights.iter().enumerate().fold(half, |s, (k, &w)| {
                s + i64::from(image.data[(t.first + k) * stride + x]) * i64::from(w)
            });
            data.push(clamp8(sum));
        }
    }
    Rgb {
        width: image.width,
        height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_of_an_unchanged_size_are_the_identity() {
        for t in bilinear_taps(5, 5) {
            assert_eq!(t.weights[0], 1 << RESAMPLE_BITS);
            assert!(t.weights[1..].iter().all(|&w| w == 0));
        }
    }

    #[test]
    fn shrinking_by_two_averages_pairs_with_neighbours() {
        // A triangle of half-width 2 around input position 3: inputs 1, 2
        // and 3 weigh 1/4, 3/4 and 3/4 before normalizing (input 4 is past
        // the edge), so 1/7, 3/7, 3/7.
        let taps = bilinear_taps(4, 2);
        assert_eq!(taps[0].first, 0);
        assert_eq!(taps[1].first, 1);
        let one = f64::from(1u32 << RESAMPLE_BITS);
        let w: Vec<f64> = taps[1]
            .weights
            .iter()
            .map(|&w| f64::from(w) / one)
            .collect();
        assert!((w[0] - 1.0 / 7.0).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn every_type_the_host_takes_gives_the_pngs_pixels() {
        // Four colours, so that GIF's palette holds them exactly; WebP
        // lossless (the encoder the crate has).
        let picture = image::RgbImage::from_fn(9, 7, |x, y| {
            image::Rgb(match (x + y) % 4 {
                0 => [250, 10, 10],
                1 => [10, 250, 10],
                2 => [10, 10, 250],
                _ => [128, 128, 128],
            })
        });
        let encoded = |format: image::ImageFormat| {
            let mut bytes = std::io::Cursor::new(Vec::new());
            DynamicImage::ImageRgb8(picture.clone())
                .write_to(&mut bytes, format)
                .unwrap();
            bytes.into_inner()
        };
        let png = preprocess_image(&encoded(image::ImageFormat::Png), 4).unwrap();
        for format in [
            image::ImageFormat::Gif,
            image::ImageFormat::WebP,
            image::ImageFormat::Bmp,
        ] {
            let got = preprocess_image(&encoded(format), 4).unwrap();
            assert_eq!(got, png, "{format:?}");
        }
        let error = preprocess_image(b"GIF89a", 4).unwrap_err().to_string();
        assert!(error.contains("as PNG, JPEG, GIF, WebP or BMP"), "{error}");
    }

    #[test]
    fn an_opaque_pixel_keeps_its_colour_and_a_clear_one_turns_white() {
        let mut picture = image::RgbaImage::new(2, 1);
        picture.put_pixel(0, 0, image::Rgba([10, 20, 30, 255]));
        picture.put_pixel(1, 0, image::Rgba([10, 20, 30, 0]));
        let rgb = composite_on_white(&DynamicImage::ImageRgba8(picture));
        assert_eq!(rgb, [10, 20, 30, 255, 255, 255]);
    }
}
