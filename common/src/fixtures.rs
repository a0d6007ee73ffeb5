//! Parameter shapes of well-known models, for placement tests and benchmarks: the
//! parameters a parameter server would hold for them (no buffers such as batch-norm
//! running statistics).

/// A parameter's name and shape.
pub type Shape = (String, Vec<usize>);

fn conv(out: &mut Vec<Shape>, name: &str, dims: [usize; 4]) {
    out.push((format!("{name}.weight"), dims.to_vec()));
}

fn norm(out: &mut Vec<Shape>, name: &str, width: usize) {
    out.push((format!("{name}.weight"), vec![width]));
    out.push((format!("{name}.bias"), vec![width]));
}

fn dense(out: &mut Vec<Shape>, name: &str, outputs: usize, inputs: usize) {
    out.push((format!("{name}.weight"), vec![outputs, inputs]));
    out.push((format!("{name}.bias"), vec![outputs]));
}

/// ResNet-50 (He et al. 2016) as in torchvision: 161 tensors, 25,557,032 parameters.
pub fn resnet50() -> Vec<Shape> {
    let mut p = Vec::new();
    conv(&mut p, "conv1", [64, 3, 7, 7]);
    norm(&mut p, "bn1", 64);
    let mut inputs = 64;
    for (layer, (blocks, width)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for block in 0..blocks {
            let name = format!("layer{}.{block}", layer + 1);
            conv(&mut p, &format!("{name}.conv1"), [width, inputs, 1, 1]);
            norm(&mut p, &format!("{name}.bn1"), width);
            conv(&mut p, &format!("{name}.conv2"), [width, width, 3, 3]);
            norm(&mut p, &format!("{name}.bn2"), width);
            conv(&mut p, &format!("{name}.conv3"), [width * 4, width, 1, 1]);
            norm(&mut p, &format!("{name}.bn3"), width * 4);
            if block == 0 {
                conv(
                    &mut p,
                    &format!("{name}.downsample.0"),
                    [width * 4, inputs, 1, 1],
                );
                norm(&mut p, &format!("{name}.downsample.1"), width * 4);
            }
            inputs = width * 4;
        }
    }
    dense(&mut p, "fc", 1000, 2048);
    p
}

/// BERT-base, uncased (Devlin et al. 2019) as in Hugging Face's `BertModel`:
/// 199 tensors, 109,482,240 parameters.
pub fn bert_base() -> Vec<Shape> {
    let (hidden, ffn) = (768, 3072);
    let mut p = vec![
        (
            "embeddings.word_embeddings.weight".to_string(),
            vec![30522, hidden],
        ),
        (
            "embeddings.position_embeddings.weight".to_string(),
            vec![512, hidden],
        ),
        (
            "embeddings.token_type_embeddings.weight".to_string(),
            vec![2, hidden],
        ),
    ];
    norm(&mut p, "embeddings.LayerNorm", hidden);
    for layer in 0..12 {
        let name = format!("encoder.layer.{layer}");
        for projection in ["query", "key", "value"] {
            dense(
                &mut p,
                &format!("{name}.attention.self.{projection}"),
                hidden,
                hidden,
            );
        }
        dense(
            &mut p,
            &format!("{name}.attention.output.dense"),
            hidden,
            hidden,
        );
        norm(
            &mut p,
            &format!("{name}.attention.output.LayerNorm"),
            hidden,
        );
        dense(&mut p, &format!("{name}.intermediate.dense"), ffn, hidden);
        dense(&mut p, &format!("{name}.output.dense"), hidden, ffn);
        norm(&mut p, &format!("{name}.output.LayerNorm"), hidden);
    }
    dense(&mut p, "pooler.dense", hidden, hidden);
    p
}

/// A fixture by name: `resnet50` or `bert-base`.
pub fn by_name(name: &str) -> Option<Vec<Shape>> {
    match name {
        "resnet50" | "resnet-50" => Some(resnet50()),
        "bert-base" | "bert_base" => Some(bert_base()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(shapes: &[Shape]) -> usize {
        shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    #[test]
    fn resnet50_matches_torchvision() {
        let shapes = resnet50();
        assert_eq!(shapes.len(), 161);
        assert_eq!(count(&shapes), 25_557_032);
    }

    #[test]
    fn bert_base_matches_hugging_face() {
        let shapes = bert_base();
        assert_eq!(shapes.len(), 199);
        assert_eq!(count(&shapes), 109_482_240);
    }
}
