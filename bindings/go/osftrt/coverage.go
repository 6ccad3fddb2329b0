package osftrt

// CFunctions maps every function of the public C headers to the Go API
// that exposes it (a function or method value, so the name cannot go stale
// without failing to compile). TestEveryHeaderFunctionIsExposed reads
// include/osftrt/*.h and fails when a header declares a function that is
// in neither this table nor NotExposed.
var CFunctions = map[string]interface{}{
	// status.h, version.h, log.h
	"osft_status_string":    Status.String,
	"osft_last_error":       (*Error).Error, // captured into Error.Message with each failure
	"osft_clear_last_error": ClearLastError,
	"osft_version":          Version,
	"osft_version_string":   VersionString,
	"osft_build_info":       BuildInfo,
	"osft_has_feature":      HasFeature,
	"osft_set_log_callback": SetLogSink,
	// context.h
	"osft_device_count":               DeviceCount,
	"osft_context_options_init":       DefaultContextOptions,
	"osft_context_create":             NewContext,
	"osft_context_destroy":            (*Context).Close,
	"osft_context_get_device":         (*Context).Device,
	"osft_context_set_stream":         (*Context).SetStream,
	"osft_context_get_stream":         (*Context).Stream,
	"osft_context_synchronize":        (*Context).Synchronize,
	"osft_context_reserve_workspace":  (*Context).ReserveWorkspace,
	"osft_context_release_workspace":  (*Context).ReleaseWorkspace,
	"osft_context_get_workspace_size": (*Context).WorkspaceSize,
	"osft_context_get_memory_stats":   (*Context).MemoryStats,
	"osft_memory_stats_init":          (*Context).MemoryStats, // osft_memory_stats_t's constructor
	"osft_context_reset_peak_memory":  (*Context).ResetPeakMemory,
	"osft_set_num_threads":            SetNumThreads,
	"osft_get_num_threads":            NumThreads,
	// comm.h
	"osft_comm_options_init":        DefaultCommOptions,
	"osft_comm_create_self":         NewSelfComm,
	"osft_comm_create_mpi":          NewMPIComm,
	"osft_comm_nccl_unique_id":      NewNCCLUniqueID,
	"osft_comm_create_nccl":         NewNCCLComm,
	"osft_comm_create_nccl_from_id": NewNCCLCommFromID,
	"osft_comm_callbacks_init":      NewCallbackComm,
	"osft_comm_create_callbacks":    NewCallbackComm,
	"osft_comm_destroy":             (*Comm).Close,
	"osft_comm_get_info":            (*Comm).Info,
	"osft_comm_allreduce_sum":       (*Comm).AllreduceSum,
	"osft_comm_allgather":           (*Comm).Allgather,
	"osft_comm_barrier":             (*Comm).Barrier,
	"osft_comm_get_stats":           (*Comm).Stats,
	"osft_comm_stats_init":          (*Comm).Stats, // osft_comm_stats_t's constructor
	"osft_comm_reset_stats":         (*Comm).ResetStats,
	// flce.h
	"osft_flce_options_init":  DefaultFLCEOptions,
	"osft_flce_create":        NewFLCE,
	"osft_flce_destroy":       (*FLCE).Close,
	"osft_flce_get_options":   (*FLCE).Options,
	"osft_flce_inputs_init":   (*FLCE).Compute, // FLCEInputs
	"osft_flce_outputs_init":  (*FLCE).Compute, // FLCEOutputs
	"osft_flce_compute":       (*FLCE).Compute,
	"osft_flce_get_plan":      (*FLCE).Plan,
	"osft_flce_plan_init":     (*FLCE).Plan, // the plan the call fills in
	"osft_flce_check_targets": (*FLCE).CheckTargets,
	// flinear.h
	"osft_flinear_options_init":        DefaultFLinearOptions,
	"osft_flinear_create_from_weight":  NewFLinear,
	"osft_flinear_factors_init":        NewFLinearFromFactors,
	"osft_flinear_create_from_factors": NewFLinearFromFactors,
	"osft_flinear_destroy":             (*FLinear).Close,
	"osft_flinear_get_dims":            (*FLinear).Dims,
	"osft_flinear_get_factor":          ReadFactor[float32], // and WriteFactor, FactorShape
	"osft_flinear_set_strategy":        (*FLinear).SetStrategy,
	"osft_flinear_choose_strategy":     (*FLinear).ChooseStrategy,
	"osft_flinear_forward":             (*FLinear).Forward,
	"osft_flinear_grads_init":          (*FLinear).Backward, // FLinearGrads
	"osft_flinear_backward":            (*FLinear).Backward,
	"osft_flinear_merge":               (*FLinear).Merge,
	"osft_flinear_redecompose":         (*FLinear).Redecompose,
	"osft_flinear_refresh":             (*FLinear).Refresh,
	"osft_flinear_mark_updated":        (*FLinear).MarkUpdated,
	"osft_flinear_get_info":            (*FLinear).Info,
	"osft_flinear_info_init":           (*FLinear).Info, // osft_flinear_info_t's constructor
	// mlp.h
	"osft_mlp_weights_init":   NewMLP, // MLPWeights
	"osft_mlp_options_init":   DefaultMLPOptions,
	"osft_mlp_create":         NewMLP,
	"osft_mlp_destroy":        (*MLP).Close,
	"osft_mlp_get_tile_count": (*MLP).TileCount,
	"osft_mlp_get_plan":       (*MLP).Plan,
	"osft_mlp_plan_init":      (*MLP).Plan, // osft_mlp_plan_t's constructor
	"osft_mlp_forward":        (*MLP).Forward,
	"osft_mlp_grads_init":     (*MLP).Backward, // MLPGrads
	"osft_mlp_backward":       (*MLP).Backward,
	// projection.h
	"osft_projector_options_init":   DefaultProjectorOptions,
	"osft_projector_create":         NewProjector,
	"osft_projector_destroy":        (*Projector).Close,
	"osft_projection_target_init":   (*Projector).AddTarget, // ProjectionTarget
	"osft_projector_add_target":     (*Projector).AddTarget,
	"osft_projector_add_layer":      (*Projector).AddLayer,
	"osft_projector_set_grads":      (*Projector).SetGrads,
	"osft_projector_prepare":        (*Projector).Prepare,
	"osft_projector_invalidate":     (*Projector).Invalidate,
	"osft_projector_project":        (*Projector).Project,
	"osft_projector_project_params": (*Projector).ProjectParams,
	"osft_projector_orthogonality":  (*Projector).Orthogonality,
	"osft_projector_get_info":       (*Projector).Info,
	"osft_projector_info_init":      (*Projector).Info, // osft_projector_info_t's constructor
	// qr.h
	"osft_qr_options_init":    DefaultQROptions,
	"osft_qr_batch":           QRBatch,
	"osft_qr_power_iteration": QRPowerIteration,
}

// NotExposed lists header functions deliberately without a Go API, and why.
var NotExposed = map[string]string{
	"osft_allocator_init": "caller allocator callbacks would call into Go for every allocation " +
		"of the library; Go contexts use the built-in allocator (ContextOptions has no allocator)",
}
