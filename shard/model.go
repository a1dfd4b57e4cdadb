package shard

import "shoal/engine/model"

// HeldTensor gives the engine the held part of the named tensor: a shard is
// a model.Source.
func (s *Shard) HeldTensor(name string) (model.HeldTensor, bool) {
	t, ok := s.Tensor(name)
	if !ok {
		return model.HeldTensor{}, false
	}
	return model.HeldTensor{Type: t.Info.Type, Cols: t.Cols(), Rows: t.Rows(), Data: t.Data}, true
}

// Release drops the pages of b, tensor bytes the engine has copied, when
// they are mapped from the model file; it reports whether it did (see
// gguf.File.Release). Bytes the shard holds in memory are left alone.
func (s *Shard) Release(b []byte) bool {
	if s.release == nil {
		return false
	}
	return s.release(b)
}

// Slice is the engine's view of the spec's tensor-parallel part: nil when
// the spec holds whole layers.
func (s ShardSpec) Slice(c *model.Config) *model.Slice {
	if s.TPSize <= 1 {
		if s.Experts == nil {
			return nil
		}
		return &model.Slice{Size: 1, HeadHi: c.NHead, FFNHi: c.FFNDim(), Experts: s.Experts}
	}
	return &model.Slice{Rank: s.TPRank, Size: s.TPSize, HeadLo: s.HeadLo, HeadHi: s.HeadHi,
		FFNLo: s.FFNLo, FFNHi: s.FFNHi, Experts: s.Experts}
}

// Model binds the shard's tensors as a model holding layers [Lo,Hi) of the
// spec and its slice, ready for model.NewRunner (with a model.Collective
// when the spec is tensor parallel). The model's weights are views of the
// shard's data: close the shard only after the model's last use.
func (s *Shard) Model() (*model.Model, error) {
	return model.LoadSource(s.Config, s.Spec.Lo, s.Spec.Hi, s.Spec.Slice(&s.Config), s)
}
