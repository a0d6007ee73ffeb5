//! [`ModelShapes`]: the tensors a plan moves, from a built-in model
//! (`resnet50`, `bert-base`, `mlp:784,128,10`), a JSON list of shapes, or a
//! safetensors file's header.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The largest model a plan takes: 1 PiB of f32 values.
const MAX_MODEL_BYTES: u64 = 1 << 50;

/// One tensor of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorShape {
    /// Its name.
    pub name: String,
    /// Its dimensions.
    pub shape: Vec<u64>,
}

impl TensorShape {
    fn new(name: impl Into<String>, shape: &[u64]) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// Its elements (`ModelShapes::from_spec` refuses shapes whose product
    /// overflows).
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    fn checked_elements(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }
}

/// A model's trainable tensors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShapes {
    /// Where the shapes came from (`resnet50`, a file name, ...).
    pub name: String,
    /// Its tensors.
    pub tensors: Vec<TensorShape>,
}

impl ModelShapes {
    /// Its parameters.
    pub fn parameters(&self) -> u64 {
        self.tensors.iter().map(TensorShape::elements).sum()
    }

    /// Its size in bytes as f32.
    pub fn f32_bytes(&self) -> u64 {
        4 * self.parameters()
    }

    /// Each tensor's size in bytes as f32.
    pub fn tensor_bytes(&self) -> Vec<u64> {
        self.tensors.iter().map(|t| 4 * t.elements()).collect()
    }

    /// The model `spec` names: a built-in (`resnet50`, `bert-base`,
    /// `mlp:IN,HIDDEN...,OUT`), a `.json` list of `{name, shape}`, or a
    /// `.safetensors` file.
    ///
    /// # Errors
    /// An unknown name, or a file that cannot be read or does not parse.
    pub fn from_spec(spec: &str) -> Result<Self, String> {
        if let Some(widths) = spec.strip_prefix("mlp:") {
            return mlp(widths);
        }
        match spec {
            "resnet50" => return Ok(resnet50()),
            "bert-base" => return Ok(bert_base()),
            _ => {}
        }
        let path = Path::new(spec);
        let bytes = std::fs::read(path).map_err(|e| {
            format!(
                "--model {spec}: not resnet50, bert-base or mlp:..., and not a readable file ({e})"
            )
        })?;
        let tensors = if spec.ends_with(".safetensors") {
            from_safetensors(&bytes).map_err(|e| format!("--model {spec}: {e}"))?
        } else {
            serde_json::from_slice::<Vec<TensorShape>>(&bytes).map_err(|e| {
                format!("--model {spec}: not a JSON list of {{\"name\", \"shape\"}} ({e})")
            })?
        };
        if tensors.is_empty() {
            return Err(format!("--model {spec}: no tensors"));
        }
        let total = tensors.iter().try_fold(0u64, |sum, t| {
            t.checked_elements()
                .and_then(|n| n.checked_mul(4))
                .and_then(|bytes| sum.checked_add(bytes))
        });
        if total.is_none_or(|bytes| bytes > MAX_MODEL_BYTES) {
            return Err(format!(
                "--model {spec}: more than {MAX_MODEL_BYTES} bytes of parameters"
            ));
        }
        Ok(Self {
            name: spec.to_string(),
            tensors,
        })
    }
}

/// The tensors in a safetensors file's header, whatever their stored dtype.
fn from_safetensors(bytes: &[u8]) -> Result<Vec<TensorShape>, String> {
    let (_, metadata) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| format!("not a safetensors file ({e})"))?;
    let mut tensors: Vec<TensorShape> = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
            TensorShape::new(name, &shape)
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(tensors)
}

/// A fully connected network of the given widths: a weight and a bias per layer.
fn mlp(widths: &str) -> Result<ModelShapes, String> {
    let widths: Vec<u64> = widths
        .split(',')
        .map(|w| w.trim().parse::<u64>().ok().filter(|&w| w > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("mlp:{widths}: widths must be positive whole numbers"))?;
    if widths.len() < 2 {
        return Err(format!(
            "mlp:{widths:?}: at least an input and an output width"
        ));
    }
    let tensors = widths
        .windows(2)
        .enumerate()
        .flat_map(|(i, pair)| {
            [
                TensorShape::new(format!("fc{i}.weight"), &[pair[1], pair[0]]),
                TensorShape::new(format!("fc{i}.bias"), &[pair[1]]),
            ]
        })
        .collect();
    let name = format!(
        "mlp:{}",
        widths
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    Ok(ModelShapes { name, tensors })
}

/// ResNet-50 (torchvision's layout, 1,000 classes): 25,557,032 parameters,
/// batch norms counted by their weight and bias.
fn resnet50() -> ModelShapes {
    let mut tensors = vec![TensorShape::new("conv1.weight", &[64, 3, 7, 7])];
    norm(&mut tensors, "bn1", 64);
    let mut channels = 64;
    for (stage, (&width, &blocks)) in [64u64, 128, 256, 512].iter().zip(&[3, 4, 6, 3]).enumerate() {
        for block in 0..blocks {
            let name = format!("layer{}.{block}", stage + 1);
            let out = width * 4;
            let convs = [
                ("conv1", [width, channels, 1, 1]),
                ("conv2", [width, width, 3, 3]),
                ("conv3", [out, width, 1, 1]),
            ];
            for (i, (conv, shape)) in convs.iter().enumerate() {
                tensors.push(TensorShape::new(format!("{name}.{conv}.weight"), shape));
                norm(&mut tensors, &format!("{name}.bn{}", i + 1), shape[0]);
            }
            if block == 0 {
                let shape = [out, channels, 1, 1];
                tensors.push(TensorShape::new(
                    format!("{name}.downsample.0.weight"),
                    &shape,
                ));
                norm(&mut tensors, &format!("{name}.downsample.1"), out);
            }
            channels = out;
        }
    }
    tensors.push(TensorShape::new("fc.weight", &[1000, 2048]));
    tensors.push(TensorShape::new("fc.bias", &[1000]));
    ModelShapes {
        name: "resnet50".to_string(),
        tensors,
    }
}

/// A normalisation layer's trainable tensors (batch or layer norm alike): a
/// weight and a bias of `width`.
fn norm(tensors: &mut Vec<TensorShape>, name: &str, width: u64) {
    tensors.push(TensorShape::new(format!("{name}.weight"), &[width]));
    tensors.push(TensorShape::new(format!("{name}.bias"), &[width]));
}

/// BERT-base, uncased (12 layers, hidden 768, 30,522 tokens, with the
/// pooler): 109,482,240 parameters.
fn bert_base() -> ModelShapes {
    let (hidden, inner) = (768, 3072);
    let mut tensors = vec![
        TensorShape::new("embeddings.word_embeddings.weight", &[30522, hidden]),
        TensorShape::new("embeddings.position_embeddings.weight", &[512, hidden]),
        TensorShape::new("embeddings.token_type_embeddings.weight", &[2, hidden]),
    ];
    norm(&mut tensors, "embeddings.LayerNorm", hidden);
    let linear = |tensors: &mut Vec<TensorShape>, name: &str, out: u64, input: u64| {
        tensors.push(TensorShape::new(format!("{name}.weight"), &[out, input]));
        tensors.push(TensorShape::new(format!("{name}.bias"), &[out]));
    };
    for layer in 0..12 {
        let name = format!("encoder.layer.{layer}");
        for part in ["query", "key", "value"] {
            linear(
                &mut tensors,
                &format!("{name}.attention.self.{part}"),
                hidden,
                hidden,
            );
        }
        linear(
            &mut tensors,
            &format!("{name}.attention.output.dense"),
            hidden,
            hidden,
        );
        norm(
            &mut tensors,
            &format!("{name}.attention.output.LayerNorm"),
            hidden,
        );
        linear(
            &mut tensors,
            &format!("{name}.intermediate.dense"),
            inner,
            hidden,
        );
        linear(&mut tensors, &format!("{name}.output.dense"), hidden, inner);
        norm(&mut tensors, &format!("{name}.output.LayerNorm"), hidden);
    }
    linear(&mut tensors, "pooler.dense", hidden, hidden);
    ModelShapes {
        name: "bert-base".to_string(),
        tensors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_models_have_their_published_sizes() {
        assert_eq!(resnet50().parameters(), 25_557_032);
        assert_eq!(bert_base().parameters(), 109_482_240);
        let mlp = ModelShapes::from_spec("mlp:784,128,10").unwrap();
        assert_eq!(mlp.parameters(), 784 * 128 + 128 + 128 * 10 + 10);
        assert_eq!(mlp.tensors.len(), 4);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert!(
            ModelShapes::from_spec("mlp:784")
                .unwrap_err()
                .contains("at least")
        );
        assert!(
            ModelShapes::from_spec("mlp:7,x")
                .unwrap_err()
                .contains("positive")
        );
        let missing = ModelShapes::from_spec("/nonexistent/model.json").unwrap_err();
        assert!(missing.contains("not resnet50"), "{missing}");
    }

    #[test]
    fn a_json_list_of_shapes_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        std::fs::write(
            &path,
            r#"[{"name":"w","shape":[3,4]},{"name":"b","shape":[3]}]"#,
        )
        .unwrap();
        let model = ModelShapes::from_spec(path.to_str().unwrap()).unwrap();
        assert_eq!(model.parameters(), 15);
        assert_eq!(model.f32_bytes(), 60);
    }
}
