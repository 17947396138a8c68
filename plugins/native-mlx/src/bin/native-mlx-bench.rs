//! x
fn main() { println!("{}", hangar_native_mlx::v()); let a = mlx_rs::Array::from_slice(&[1.0f32,2.0], &[2]); println!("{:?}", (&a + &a)); }
