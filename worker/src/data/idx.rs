//! The IDX format (MNIST, Fashion-MNIST): a big-endian header of dimensions followed
//! by unsigned bytes. Files may be gzipped (as Debian's `dataset-fashion-mnist`
//! installs them) or plain; both are read.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::{DataError, Dataset, Split};

/// Where Debian's `dataset-fashion-mnist` package puts the files.
pub const DEBIAN_FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// An IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes, gunzipping it if it starts with the gzip magic.
///
/// # Errors
/// [`DataError::Io`] when the file cannot be read; [`DataError::Malformed`] naming the
/// file when the header or length is wrong.
pub fn read_idx(path: &Path) -> Result<IdxArray, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(io)?;
        out
    } else {
        raw
    };
    parse_idx(&bytes).map_err(|reason| DataError::Malformed {
        path: path.to_path_buf(),
        reason,
    })
}

fn parse_idx(bytes: &[u8]) -> Result<IdxArray, String> {
    let [0, 0, kind, ndim, rest @ ..] = bytes else {
        return Err("shorter than an IDX header, or does not start with two zero bytes".into());
    };
    if *kind != 0x08 {
        return Err(format!(
            "element type 0x{kind:02x} is not unsigned byte (0x08)"
        ));
    }
    let ndim = *ndim as usize;
    if rest.len() < 4 * ndim {
        return Err(format!(
            "header announces {ndim} dimensions but the file ends inside them"
        ));
    }
    let (header, data) = rest.split_at(4 * ndim);
    let dims: Vec<usize> = header
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("dimensions overflow")?;
    if data.len() != expected {
        return Err(format!(
            "dimensions {dims:?} need {expected} bytes of data but the file has {}",
            data.len()
        ));
    }
    Ok(IdxArray {
        dims,
        data: data.to_vec(),
    })
}

/// Finds `dir/name` or `dir/name.gz`.
fn find(dir: &Path, name: &str) -> Result<PathBuf, DataError> {
    let plain = dir.join(name);
    let gz = dir.join(format!("{name}.gz"));
    [plain.clone(), gz]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| DataError::Io {
            path: plain,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "neither {name} nor {name}.gz is in {}; install Debian's dataset-fashion-mnist \
                     (files in {DEBIAN_FASHION_MNIST_DIR}) or pass --data-dir",
                    dir.display()
                ),
            ),
        })
}

fn load_split(dir: &Path, prefix: &str) -> Result<Split, DataError> {
    let images_path = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read_idx(&images_path)?;
    let labels = read_idx(&labels_path)?;
    let malformed = |path: &Path, reason: String| DataError::Malformed {
        path: path.to_path_buf(),
        reason,
    };
    let [count, rows, cols] = images.dims[..] else {
        return Err(malformed(
            &images_path,
            format!("images need 3 dimensions, found {:?}", images.dims),
        ));
    };
    if labels.dims != [count] {
        let reason = format!(
            "{} labels for {count} images in {}",
            labels.dims.first().unwrap_or(&0),
            images_path.display()
        );
        return Err(malformed(&labels_path, reason));
    }
    if let Some(bad) = labels.data.iter().find(|&&l| l > 9) {
        return Err(malformed(
            &labels_path,
            format!("label {bad} is outside 0..=9"),
        ));
    }
    Ok(Split::dense(
        images.data.iter().map(|&p| p as f32 / 255.0).collect(),
        labels.data.iter().map(|&l| l as u32).collect(),
        rows * cols,
    ))
}

/// Loads an MNIST-layout data set (`train-*` and `t10k-*` files) from `dir`.
///
/// # Errors
/// A [`DataError`] naming the missing or malformed file.
pub fn load_mnist_layout(dir: &Path, name: &str) -> Result<Dataset, DataError> {
    let train = load_split(dir, "train")?;
    let test = load_split(dir, "t10k")?;
    if train.width != test.width {
        return Err(DataError::Invalid(format!(
            "train images have {} pixels but test images {}",
            train.width, test.width
        )));
    }
    Ok(Dataset {
        name: name.into(),
        classes: 10,
        train,
        test,
    })
}

/// Writes an IDX file of unsigned bytes (for tests and tools).
///
/// # Errors
/// When the file cannot be written.
pub fn write_idx(path: &Path, dims: &[usize], data: &[u8]) -> std::io::Result<()> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        bytes.extend_from_slice(&(d as u32).to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_set(dir: &Path, train: usize, test: usize) {
        for (prefix, n) in [("train", train), ("t10k", test)] {
            let images: Vec<u8> = (0..n * 4).map(|i| (i * 37 % 256) as u8).collect();
            let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
            write_idx(
                &dir.join(format!("{prefix}-images-idx3-ubyte")),
                &[n, 2, 2],
                &images,
            )
            .unwrap();
            write_idx(
                &dir.join(format!("{prefix}-labels-idx1-ubyte")),
                &[n],
                &labels,
            )
            .unwrap();
        }
    }

    #[test]
    fn reads_a_small_written_set() {
        let dir = tempfile::tempdir().unwrap();
        write_set(dir.path(), 12, 5);
        let set = load_mnist_layout(dir.path(), "tiny").unwrap();
        assert_eq!((set.train.len(), set.test.len(), set.width()), (12, 5, 4));
        assert_eq!(set.train.labels[11], 1);
        assert_eq!(set.train.features[1], 37.0 / 255.0);
    }

    #[test]
    fn reads_gzipped_files() {
        use flate2::{Compression, write::GzEncoder};
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        write_set(dir.path(), 3, 3);
        let plain = dir.path().join("train-labels-idx1-ubyte");
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&std::fs::read(&plain).unwrap()).unwrap();
        std::fs::write(
            dir.path().join("train-labels-idx1-ubyte.gz"),
            gz.finish().unwrap(),
        )
        .unwrap();
        std::fs::remove_file(&plain).unwrap();
        assert_eq!(
            load_mnist_layout(dir.path(), "tiny").unwrap().train.labels,
            vec![0, 1, 2]
        );
    }

    #[test]
    fn missing_file_is_named_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_mnist_layout(dir.path(), "x").unwrap_err().to_string();
        assert!(
            err.contains("train-images-idx3-ubyte") && err.contains("dataset-fashion-mnist"),
            "{err}"
        );
    }

    #[test]
    fn truncated_and_mismatched_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        write_set(dir.path(), 4, 4);
        let images = dir.path().join("train-images-idx3-ubyte");
        let bytes = std::fs::read(&images).unwrap();
        std::fs::write(&images, &bytes[..bytes.len() - 1]).unwrap();
        let err = load_mnist_layout(dir.path(), "x").unwrap_err().to_string();
        assert!(
            err.contains("train-images-idx3-ubyte") && err.contains("need 16 bytes"),
            "{err}"
        );

        write_set(dir.path(), 4, 4);
        write_idx(
            &dir.path().join("train-labels-idx1-ubyte"),
            &[3],
            &[0, 1, 2],
        )
        .unwrap();
        let err = load_mnist_layout(dir.path(), "x").unwrap_err().to_string();
        assert!(
            err.contains("train-labels-idx1-ubyte") && err.contains("3 labels for 4 images"),
            "{err}"
        );

        std::fs::write(
            dir.path().join("train-labels-idx1-ubyte"),
            b"\x00\x00\x0d\x01\x00\x00\x00\x01x",
        )
        .unwrap();
        let err = load_mnist_layout(dir.path(), "x").unwrap_err().to_string();
        assert!(err.contains("0x0d"), "{err}");
    }

    #[test]
    #[ignore = "needs Debian's dataset-fashion-mnist; .ci/run installs it and runs the ignored fashion_mnist tests"]
    fn real_fashion_mnist_when_installed() {
        let dir = Path::new(DEBIAN_FASHION_MNIST_DIR);
        assert!(
            dir.is_dir(),
            "{DEBIAN_FASHION_MNIST_DIR} is absent: apt-get install dataset-fashion-mnist"
        );
        let set = load_mnist_layout(dir, "fashion-mnist").unwrap();
        assert_eq!(
            (set.train.len(), set.test.len(), set.width()),
            (60_000, 10_000, 784)
        );
        let mut counts = [0usize; 10];
        set.test
            .labels
            .iter()
            .for_each(|&l| counts[l as usize] += 1);
        assert_eq!(counts, [1000; 10], "Fashion-MNIST's test split is balanced");
    }
}
